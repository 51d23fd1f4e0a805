"""The repository's commands, each run as documented (`bash scripts/<name>.sh`, `python scripts/<name>.py`). A
package only so that the tests import the Python ones as modules (`from scripts import soak`)."""
