#!/bin/sh
# The monarch command line's answers to bad input: each case names what was wrong and exits
# non-zero (help exits 0). Usage: cli_test.sh PATH/TO/monarch
monarch=$1
failed=0
# expect EXIT_OK(0|nonzero) TEXT ARGS...: runs monarch ARGS, checks the exit and that TEXT is in
# its output (stdout and stderr together).
expect() {
  want_rc=$1 text=$2
  shift 2
  out=$(timeout 20 "$monarch" "$@" 2>&1)
  rc=$?
  if [ "$want_rc" = 0 ] && [ $rc -ne 0 ] || [ "$want_rc" != 0 ] && [ $rc -eq 0 ] ||
    [ $rc -ge 124 ]; then
    echo "FAIL monarch $*: exit $rc (want $want_rc); output: $out"
    failed=1
  elif ! printf '%s' "$out" | grep -qF -- "$text"; then
    echo "FAIL monarch $*: output lacks '$text': $out"
    failed=1
  else
    echo "ok   monarch $*: exit $rc, says '$text'"
  fi
}
expect nonzero "unknown subcommand 'bogus'" bogus
expect 0 "lighthouse" help
expect nonzero "subcommand" 
expect nonzero "--bogus" agent --bogus
expect nonzero "--listen is required" agent
expect nonzero "--bogus" lighthouse --bogus
expect nonzero "--listen is required" lighthouse
expect nonzero "bad channel address 'garbage'" agent --listen garbage
expect nonzero "reachable only inside this process" agent --listen inproc://a
expect nonzero "reachable only inside this process" lighthouse --listen inproc://lh
expect nonzero "not started by a host agent" worker
# Lighthouse timing flags: 0 where it would silently mean the config default, and durations past
# the config layer's limit, are refused before anything binds.
lh="lighthouse --listen unix://@monarch-cli-test-$$"
expect nonzero "--join-timeout-ms 0: must be above 0" $lh --join-timeout-ms 0
expect nonzero "--heartbeat-timeout-ms 0: must be above 0" $lh --heartbeat-timeout-ms 0
expect nonzero "--min-replicas 0: a quorum needs at least 1" $lh --min-replicas 0
expect nonzero "--join-timeout-ms: duration '9223372036854775807ms' is too large" $lh \
  --join-timeout-ms 9223372036854775807
expect nonzero "--recovery-wait-ms: duration '99999999999999ms' is too large" $lh \
  --recovery-wait-ms 99999999999999
exit $failed
