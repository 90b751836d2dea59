# Sourced by .ci/run: make sure the programs the tests start themselves are on this machine (Debian
# packages): redis-server and pgbouncer for the fleet tests (tests/fleet.py, tests/pg.py, run on private
# ports), chromium and chromium-driver for the console's browser tests (headless, no download at test
# time), valgrind for the instruction counts of the step-cost ceiling. Exports nothing; starts nothing.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
if [ ${#missing[@]} -gt 0 ]; then
  echo "+ installing the Debian packages ${missing[*]} (for the fleet, PgBouncer, console and step-cost tests)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  # The packages start their own services; the tests start private ones and need none of these.
  service redis-server stop >/dev/null 2>&1 || true
  service pgbouncer stop >/dev/null 2>&1 || true
fi
