"""`python -m code_server [--host H] [--port P] ...`: serve until SIGTERM; see `code_server.server`."""

from code_server.server import main

main()
