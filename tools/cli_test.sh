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
# Empty: each served on no address (or the defaults) instead of refusing.
expect nonzero "--listen: must not be empty" agent --listen ""
expect nonzero "--listen: must not be empty" lighthouse --listen ""
expect nonzero "--http: must not be empty" lighthouse --listen unix://@monarch-cli-e-$$ --http ""
expect nonzero "--secret-file: must not be empty" lighthouse --listen unix://@monarch-cli-e-$$ \
  --secret-file ""
expect nonzero "reachable only inside this process" agent --listen inproc://a
expect nonzero "reachable only inside this process" lighthouse --listen inproc://lh
expect nonzero "not started by a host agent" worker
# TCP without the job secret: the message names the CLI's ways to give it, not a C++ field.
( unset MONARCH_SECRET MONARCH_SECRET_FILE
  expect nonzero "a TCP address needs the job's shared secret: set MONARCH_SECRET or" \
    agent --listen tcp://127.0.0.1:0
  expect nonzero "set --secret-file, MONARCH_SECRET or MONARCH_SECRET_FILE" \
    lighthouse --listen tcp://127.0.0.1:0
  exit $failed ) || failed=1
# Lighthouse timing flags: 0 where it would silently mean the config default, and durations past
# the config layer's limit, are refused before anything binds.
lh="lighthouse --listen unix://@monarch-cli-test-$$"
expect nonzero "--join-timeout-ms: must be at least 1, not 0" $lh --join-timeout-ms 0
expect nonzero "--heartbeat-timeout-ms: must be at least 1, not 0" $lh --heartbeat-timeout-ms 0
expect nonzero "--min-replicas: must be at least 1, not 0" $lh --min-replicas 0
expect nonzero "--join-timeout-ms: duration '9223372036854775807ms' is too large" $lh \
  --join-timeout-ms 9223372036854775807
expect nonzero "--recovery-wait-ms: duration '99999999999999ms' is too large" $lh \
  --recovery-wait-ms 99999999999999
# Numbers are checked as text before CLI11 converts them: what is wrong is said in words (CLI11's
# own check said "not in range 0.000000 to" a 309-digit bound for all of these).
expect nonzero "--min-replicas: 'abc' is not an integer" $lh --min-replicas abc
expect nonzero "--min-replicas: must be at least 1, not -1" $lh --min-replicas -1
expect nonzero "--heartbeat-timeout-ms: must be at least 1, not -5" $lh --heartbeat-timeout-ms -5
exit $failed
