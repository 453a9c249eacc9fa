# Sourced by the scripts/install_*.sh scripts: `apt_install SCRIPT PACKAGE...` installs Debian packages
# quietly, once (`apt-get update` first), without letting their maintainer scripts start a service.
# Needs root; otherwise, or without apt-get, it says what to install and returns 1.

apt_install() {
  local script=$1
  shift
  if [ "$(id -u)" -ne 0 ]; then
    echo "$script: $* missing and not running as root; install them with: sudo apt-get install $*" >&2
    return 1
  fi
  if ! command -v apt-get > /dev/null 2>&1; then
    echo "$script: $* missing and apt-get not found (not a Debian-based system);" \
         "install them with the system's package manager" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  local log policy=/usr/sbin/policy-rc.d made_policy=0 status=0
  log=$(mktemp)
  if [ ! -e "$policy" ]; then  # tests start the servers themselves: no service started on install
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    made_policy=1
  fi
  { apt-get update -qq && apt-get install -qq -y --no-install-recommends "$@"; } > "$log" 2>&1 || status=$?
  [ "$made_policy" -eq 1 ] && rm -f "$policy"
  if [ "$status" -ne 0 ]; then
    cat "$log" >&2
    echo "$script: apt-get could not install $*" >&2
  fi
  rm -f "$log"
  return "$status"
}
