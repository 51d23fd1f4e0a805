#!/usr/bin/env bash
# Launch commands (mason.py, scripts/*.sh) source this path; the real script moved to code_server/.
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../../code_server" && pwd)/code_api_setup.sh"
else
    exec "${BASH:-bash}" "$(cd "$(dirname "$0")/../../code_server" && pwd)/code_api_setup.sh" "$@"
fi
