# Sourced by .ci/run: make sure the servers the fleet tests start themselves are on this machine
# (Debian packages redis-server and pgbouncer; tests/fleet.py and tests/pg.py run them on private
# ports). Exports nothing; starts nothing.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
if [ ${#missing[@]} -gt 0 ]; then
  echo "+ installing the Debian packages ${missing[*]} (for the fleet and PgBouncer tests)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  # The packages start their own services; the tests start private ones and need none of these.
  service redis-server stop >/dev/null 2>&1 || true
  service pgbouncer stop >/dev/null 2>&1 || true
fi
