# Sourced by .ci/run: make sure PostgreSQL's server binaries are on this machine, so the test
# suite can start its own throwaway server (tests/pg.py). Exports nothing; starts nothing.
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  echo "+ installing the Debian package postgresql (for the PostgresJournal tests)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
