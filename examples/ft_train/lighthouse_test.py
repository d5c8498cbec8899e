#!/usr/bin/env python3
"""Tests of the standalone lighthouse (`monarch lighthouse`) under a real ft_train job.

  lighthouse_test.py MONARCH FT_TRAIN WORKDIR freeze    SIGSTOP the lighthouse past the heartbeat
                                                        timeout, SIGCONT; then SIGKILL it and
                                                        restart it on the same address
  lighthouse_test.py MONARCH FT_TRAIN WORKDIR http      /status fields, refused kills, bad paths;
                                                        a kill with the secret kills the group and
                                                        the job heals it
  lighthouse_test.py MONARCH FT_TRAIN WORKDIR flags     bad flags (lighthouse's and ft_train's) are
                                                        refused with a clear message
  lighthouse_test.py MONARCH FT_TRAIN WORKDIR jobs      jobs one after the other on one lighthouse
                                                        (Q-10); a job started before its
                                                        lighthouse waits, saying so; a job that
                                                        cannot form a quorum, or that lost every
                                                        group, fails, naming why
  lighthouse_test.py MONARCH FT_TRAIN WORKDIR chromium  the page in headless Chromium shows the
                                                        members change when a group is killed

Real processes on loopback (TCP, with a job secret). Every wait has a deadline; the end states are
asserted from ft_train's summary and metrics: replicas bitwise equal, and one participant count
per quorum id (no two quorums under one id).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

SECRET = "lighthouse-test-secret"
REPLICAS = 3


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def wait_for(what, pred, timeout, job=None):
    """pred()'s first true value, polled until the deadline; fails naming what. With job (the
    ft_train Popen): fails at once if the job ends first, since no quorum changes after that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job is not None and job.poll() is not None:
            fail("ft_train exited %d while waiting for %s" % (job.returncode, what))
        v = pred()
        if v:
            return v
        time.sleep(0.05)  # polling an external process's state, with a deadline
    fail("timed out after %.0f s waiting for %s" % (timeout, what))


def wait_for_change(lh, what, after_qid, pred, timeout, job):
    """The first quorum change the lighthouse recorded (/status recent_changes) with a quorum id
    above after_qid that satisfies pred (given the change). Fails naming what, with the lighthouse's
    status, if none by the deadline or if the job ends first (it cannot change quorums then)."""
    def found():
        st = lh.status() or {}
        return next((c for c in st.get("recent_changes", [])
                     if c["quorum_id"] > after_qid and pred(c)), None)
    try:
        return wait_for(what, found, timeout, job)
    except SystemExit:
        print("status at the deadline: %s" % json.dumps(lh.status()), flush=True)
        raise


class Lighthouse:
    def __init__(self, monarch, listen, http="127.0.0.1:0", secret_file=None, extra=()):
        args = [monarch, "lighthouse", "--listen", listen, "--http", http] + list(extra)
        args += os.environ.get("LIGHTHOUSE_TEST_ARGS", "").split()  # e.g. to try --recovery-wait-ms 0
        if secret_file:
            args += ["--secret-file", secret_file]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        self.addr = self.url = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (self.addr is None or self.url is None):
            line = self.proc.stdout.readline()
            if not line:
                fail("monarch lighthouse exited (%s) before serving" % self.proc.poll())
            if line.startswith("LISTENING "):
                self.addr = line.split()[1]
            elif line.startswith("HTTP "):
                self.url = line.split()[1].rstrip("/")
        if self.url is None:
            fail("monarch lighthouse printed no LISTENING/HTTP line")

    def request(self, method, path, token=None, scheme="Bearer"):
        req = urllib.request.Request(self.url + path, method=method)
        if token is not None:
            req.add_header("Authorization", scheme + " " + token)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def status(self):
        code, body = self.request("GET", "/status")
        if code != 200:
            return None
        return json.loads(body)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_job(ft_train, workdir, lighthouse_addr, steps, env=None):
    out = os.path.join(workdir, "out")
    summary = os.path.join(workdir, "summary.json")
    # --spares 0: a killed group's replacement starts fresh procs. A warm spare can join the very
    # next quorum (61 ms after a kill, measured), so no quorum without the victim may ever exist for
    # the status page to show, which is what these tests look for.
    args = [ft_train, "--lighthouse", lighthouse_addr, "--no-faults", "--steps", str(steps),
            "--replicas", str(REPLICAS), "--spares", "0", "--no-progress", "--out", out,
            "--json-summary", summary]
    log = open(os.path.join(workdir, "ft_train.log"), "w")
    return (subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                             env=dict(os.environ, **(env or {}))), out, summary)


def finish_job(job, summary, workdir, timeout=120, allow_restarts=False):
    try:
        rc = job.wait(timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        fail("ft_train did not finish in %d s (log: %s/ft_train.log)" % (timeout, workdir))
    if not os.path.exists(summary):
        fail("ft_train exited %d without a summary (log: %s/ft_train.log)" % (rc, workdir))
    s = json.load(open(summary))
    print("ft_train exit %d; summary: replicas_bitwise_equal=%s survivor_restarts=%s" %
          (rc, s.get("replicas_bitwise_equal"), s.get("survivor_restarts")))
    if s.get("replicas_bitwise_equal") is not True:
        fail("replicas not bitwise equal at the end")
    if rc != 0 and not allow_restarts:
        fail("ft_train exited %d (log: %s/ft_train.log)" % (rc, workdir))
    return s


def check_one_quorum_per_id(out):
    seen = {}
    with open(os.path.join(out, "fault_free.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "quorum_id" not in r or "participants" not in r:
                continue
            q = r["quorum_id"]
            if seen.setdefault(q, r["participants"]) != r["participants"]:
                fail("quorum %d seen with %d and %d participants (split brain)" %
                     (q, seen[q], r["participants"]))
    print("quorum ids -> participants: %s" % dict(sorted(seen.items())))
    return seen


def max_step(lh):
    s = lh.status()
    return s["max_step"] if s else 0


def test_freeze(monarch, ft_train, workdir, secret_file):
    lh = Lighthouse(monarch, "tcp://127.0.0.1:0", secret_file=secret_file)
    # A long step timeout: a quorum request that the managers' channel dropped during the freeze
    # must be re-sent once the lighthouse answers again, not waited out (training stalled for the
    # whole ft.step_timeout after a thaw).
    step_timeout = 25
    job, out, summary = start_job(ft_train, workdir, lh.addr, 2500,
                                  env={"MONARCH_FT_STEP_TIMEOUT": "%ds" % step_timeout})
    try:
        wait_for("the first quorum of %d groups" % REPLICAS,
                 lambda: (lh.status() or {}).get("members") and
                 len(lh.status()["members"]) == REPLICAS and max_step(lh) >= 50, 60, job)
        hb_timeout = lh.status()["heartbeat_timeout_ms"] / 1000.0
        before = max_step(lh)
        lh.proc.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        # The fault itself: frozen until a manager's channel has given up on its quorum request in
        # flight (its delivery timeout, which ft_train sets above the mesh heartbeat timeout), and
        # for longer than the lighthouse's heartbeat timeout (+ 1.5 s), whichever comes last.
        log = os.path.join(workdir, "ft_train.log")
        wait_for("a manager to give up on its quorum request to the frozen lighthouse",
                 lambda: time.monotonic() - frozen_at > hb_timeout + 1.5 and
                 "quorum request not delivered" in open(log).read(), 30, job)
        lh.proc.send_signal(signal.SIGCONT)
        # Every group, the one whose request was dropped included, back in one quorum and
        # training: well within ft.step_timeout, which the dropped request's ranks waited out.
        def resumed_all():
            st = lh.status() or {"members": [], "max_step": 0}
            return len(st["members"]) == REPLICAS and st["max_step"] > before + 20 and st
        st = wait_for("every group back in one quorum, training, after SIGCONT (well within "
                      "ft.step_timeout, %d s)" % step_timeout, resumed_all, 15, job)
        after = st["max_step"]
        print("freeze: step %d before, %d after; members %s" % (before, after, st["members"]))
        epoch = st["epoch"]

        # Restart on the same address: SIGKILL, then a new process on the printed address.
        addr = lh.addr
        lh.proc.kill()
        lh.proc.wait()
        lh = Lighthouse(monarch, addr, secret_file=secret_file)
        if lh.addr != addr:
            fail("restarted lighthouse listens on %s, not %s" % (lh.addr, addr))
        resumed = wait_for("the managers to re-join the restarted lighthouse",
                           lambda: (lh.status() or {}).get("max_step", 0) > after and
                           len(lh.status()["members"]) == REPLICAS and lh.status(), 40, job)
        if resumed["epoch"] == epoch:
            fail("the restarted lighthouse has the old epoch")
        print("restart: quorum %d, step %d, members %s" %
              (resumed["quorum_id"], resumed["max_step"], resumed["members"]))
        finish_job(job, summary, workdir)
        seen = check_one_quorum_per_id(out)
        # No group failed: a quorum without one means the lighthouse, just thawed or restarted,
        # left out a live group it had not heard from yet, which then trained on alone.
        partial = {q: n for q, n in seen.items() if n != REPLICAS}
        if partial:
            fail("quorums without every live group (Q-7): %s" % partial)
        if resumed["quorum_id"] <= min(seen):
            fail("the restarted lighthouse reused a quorum id")
    finally:
        if job.poll() is None:
            job.kill()
        lh.stop()
    print("PASS")


def check_healing(st):
    """/status's `healing` is the current quorum's change's healers, all of them members."""
    own = [c for c in st["recent_changes"] if c["quorum_id"] == st["quorum_id"]]
    expected = own[-1]["healing"] if own else []
    if st["healing"] != expected or not set(st["healing"]) <= set(st["members"]):
        fail("/status healing %s: expected %s, members %s" %
             (st["healing"], expected, st["members"]))


def test_http(monarch, ft_train, workdir, secret_file, chromium=False):
    lh = Lighthouse(monarch, "tcp://127.0.0.1:0", secret_file=secret_file)
    job, out, summary = start_job(ft_train, workdir, lh.addr, 1500)
    try:
        st = wait_for("the first quorum of %d groups" % REPLICAS,
                      lambda: (lh.status() or {}).get("members") and
                      len(lh.status()["members"]) == REPLICAS and lh.status(), 60, job)
        for key in ("quorum_id", "members", "healing", "replicas", "recent_changes", "pending",
                    "max_step"):
            if key not in st:
                fail("/status lacks '%s': %s" % (key, st))
        check_healing(st)
        for r in st["replicas"]:
            for key in ("replica_id", "step", "heartbeat_age_ms", "healthy"):
                if key not in r:
                    fail("/status replica lacks '%s': %s" % (key, r))
        if not st["recent_changes"] or "participants" not in st["recent_changes"][-1]:
            fail("/status has no recent quorum change: %s" % st)
        victim = "replica1"
        page = None
        if chromium:
            page = dom_until(lh.url + "/", lambda p: "replica0 replica1 replica2" in p, 60)
            if "replica0 replica1 replica2" not in page:
                fail("the page does not show the members: %s" % page[:2000])
        else:
            checks = [
                ("POST", "/replica/%s/kill" % victim, None, 401),
                ("POST", "/replica/%s/kill" % victim, "wrong", 403),
                ("POST", "/replica/nobody/kill", SECRET, 404),
                ("GET", "/replica/%s/kill" % victim, SECRET, 405),
                ("GET", "/no/such/path", None, 404),
                ("DELETE", "/status", None, 405),
                # Not UTF-8: the error body must still be JSON (this aborted the lighthouse).
                ("GET", "/%ff", None, 404),
                ("POST", "/replica/%ff/kill", SECRET, 404),
            ]
            for method, path, token, want in checks:
                code, body = lh.request(method, path, token)
                if code != want or "error" not in json.loads(body):
                    fail("%s %s -> %d %s, expected %d with an error body" %
                         (method, path, code, body, want))
            # A request that announces a body and never sends it is answered at once, not after
            # the server's 5 s read timeout (no route reads a body).
            host, port = lh.url.split("//", 1)[1].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=3) as conn:
                conn.sendall(b"POST /status HTTP/1.1\r\nHost: lh\r\nContent-Length: 10\r\n\r\n")
                try:
                    head = conn.recv(64)
                except socket.timeout:
                    head = b"(nothing within 3 s)"
            if not head.startswith(b"HTTP/1.1 405"):
                fail("POST /status with an unsent body -> %r, expected 405 at once" % head)
            # Connections that send half a request and then nothing hold a server thread each
            # until its read timeout; with cpp-httplib's defaults (8 threads, 5 s) 40 of them kept
            # /status down for 40 s. The page must answer while they are open.
            idle = []
            try:
                for _ in range(40):
                    c = socket.create_connection((host, int(port)), timeout=3)
                    c.sendall(b"GET /status HTTP/1.1\r\nHost: lh\r\n")
                    idle.append(c)
                deadline = time.monotonic() + 15
                answered = None
                while answered is None and time.monotonic() < deadline:
                    try:
                        answered = lh.status()
                    except OSError:  # timed out behind the idle connections: try again
                        pass
                if answered is None:
                    fail("/status did not answer within 15 s of 40 idle half-sent requests")
            finally:
                for c in idle:
                    c.close()
            if lh.proc.poll() is not None:
                fail("the lighthouse exited (%s) on a bad request" % lh.proc.poll())
            if lh.status()["members"] != st["members"]:
                fail("a refused kill changed the quorum")
        incarnations = lh.status()["quorum_id"]
        # The scheme is case-insensitive (RFC 9110).
        code, body = lh.request("POST", "/replica/%s/kill" % victim, SECRET, scheme="bearer")
        if code != 200:
            fail("kill with the secret -> %d %s" % (code, body))
        # A repeated request (a retry, a double click) is the same kill: it must not kill the
        # victim's replacement too (checked at the end: one fault from outside).
        code, body = lh.request("POST", "/replica/%s/kill" % victim, SECRET)
        if code != 200:
            fail("a repeated kill -> %d %s" % (code, body))
        # A lighthouse too slow for the Managers' heartbeat waits (500 ms) must not lose the kill
        # (a loaded CI box did: the one reply that carried it came after its Manager gave up).
        # The fault itself: freeze it past those waits, so that the victim's beats queue up.
        lh.proc.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # the fault's duration (> the 500 ms waits), not waiting for a state
        lh.proc.send_signal(signal.SIGCONT)
        # From the lighthouse's record of quorum changes, not its current members: on a fast box
        # the quorum without the victim lasts less than one poll (a heal took 79 ms here). It may
        # not form at all: a replacement from the fork server can ask before the survivors do
        # (CI: 0.4 s after the kill), and then the first change has the victim healing.
        changed = wait_for_change(
            lh, "a quorum without %s, or with it healing" % victim, incarnations,
            lambda c: victim not in c["participants"] or victim in c["healing"], 30, job)
        print("after the kill: quorum %d members %s healing %s" %
              (changed["quorum_id"], changed["participants"], changed["healing"]))
        check_healing(lh.status())
        if chromium:
            # The page polls; the group may be healed back by the time Chromium reads it. Then
            # the change must still show in its table of recent quorum changes.
            survivors = " ".join(m for m in st["members"] if m != victim)
            rejoined = " ".join(m + " (healing)" if m == victim else m for m in st["members"])
            rows = ["<td>%s</td>" % survivors, "<td>%s</td>" % rejoined]

            def members_shown(p):
                return p.split('id="members">', 1)[-1].split("<", 1)[0]

            page2 = dom_until(lh.url + "/", lambda p: members_shown(p) and (
                victim not in members_shown(p) or any(r in p for r in rows)), 60)
            shown = members_shown(page2)
            in_table = [r for r in rows if r in page2]
            if not shown or (victim in shown and not in_table):
                fail("the page shows neither members without %s nor that change: '%s'\n%s" %
                     (victim, shown, page2[:3000]))
            print("page members before: '%s', after the kill: '%s'; in its table: %s" %
                  (" ".join(st["members"]), shown, in_table))
        if victim not in changed["participants"]:
            healed = wait_for_change(lh, "%s healed back into the quorum" % victim,
                                     changed["quorum_id"], lambda c: victim in c["participants"],
                                     60, job)
            print("healed: quorum %d (was %d) members %s" %
                  (healed["quorum_id"], incarnations, healed["participants"]))
        # Check the end state, and the one fault from outside (the kill was asked for twice).
        s = finish_job(job, summary, workdir, allow_restarts=True)
        if s.get("faults_outside") != 1:
            fail("one kill over HTTP (requested twice) -> faults_outside %s, expected 1" %
                 s.get("faults_outside"))
        check_one_quorum_per_id(out)
    finally:
        if job.poll() is None:
            job.kill()
        lh.stop()
    print("PASS")


def test_ft_train_flags(ft_train, workdir):
    """Bad ft_train input fails before training, naming the flag."""
    cases = [
        (["--lr", "nan"], "--lr: must be a finite number above 0, not nan"),
        (["--lr", "-1"], "--lr: must be a finite number above 0, not -1"),
        (["--steps", "abc"], "--steps: 'abc' is not an integer"),
        (["--batch", "99999999999999999999"], "--batch: must be from 1 to 1048576, not 9999"),
        # Within the flag's range, but more than an epoch: every allreduce timed out, and the
        # run ended after 108 s with a quorum error that did not name the batch.
        (["--batch", "1048576"], "--batch 1048576 is more than one epoch of mlp's training data "
         "(60000 samples): at most 60000"),
        (["--model", "llama-tiny", "--batch", "1048576"], "--batch 1048576 is more than one "
         "epoch of llama-tiny's training data"),
        # One past 2^64-1 was once clamped to it, and training started.
        (["--seed", "18446744073709551616"], "--seed: 18446744073709551616 is above 1844674"),
        (["--seed", "-1"], "--seed: '-1' is not an unsigned integer"),
        (["--slurm-nodes", "-1"], "--slurm-nodes: must be from 1 to 100000, not -1"),
        (["--replicas", "1"], "one replica group cannot heal a fault"),
        (["--no-faults", "--json-summary", workdir], "cannot write --json-summary"),
        (["--data", "/etc/passwd"], "/etc/passwd is not a directory"),
        (["--model", "llama-tiny", "--data", "/etc/passwd"], "/etc/passwd is not a directory"),
        (["--out", "/etc/passwd/x"], "cannot create --out '/etc/passwd/x': Not a directory"),
        # Fails at once, so the error must not claim it waited ("within 30000 ms").
        (["--lighthouse", "garbage"], "cannot reach the lighthouse at garbage: bad channel"),
        # Empty: it ran with a lighthouse of its own, as if the flag were not there.
        (["--lighthouse", ""], "--lighthouse: must not be empty"),
        # The channel layer's text named ChannelOptions::secret, a C++ field.
        (["--lighthouse", "tcp://127.0.0.1:1"], "a TCP address needs the job's shared secret: set "
         "MONARCH_SECRET or MONARCH_SECRET_FILE"),
        (["--out", ""], "--out: must not be empty"),
    ]
    env = {k: v for k, v in os.environ.items()
           if k not in ("MONARCH_SECRET", "MONARCH_SECRET_FILE")}
    for args, want in cases:
        r = subprocess.run([ft_train, "--steps", "5"] + args, capture_output=True, text=True,
                           timeout=60, env=env)
        if r.returncode == 0 or want not in r.stderr + r.stdout:
            fail("ft_train %s: exit %d, output %r; expected a failure saying %r" %
                 (" ".join(args), r.returncode, (r.stderr + r.stdout)[-2000:], want))
    print("PASS")


def run_ft_train(args, workdir, name, env=None, timeout=120):
    t0 = time.monotonic()
    r = subprocess.run(args + ["--no-progress", "--out", os.path.join(workdir, name)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    return r, r.stderr + r.stdout, time.monotonic() - t0


def pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def parent_of(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_all_groups_lost(ft_train, workdir):
    """Every group killed at once (the fork server that forked them all): no group holds the
    committed state any more, so the run fails at once, saying so, instead of respawning groups
    that would wait forever for a donor."""
    out = os.path.join(workdir, "lost")
    shutil.rmtree(out, ignore_errors=True)  # a metrics file of an earlier run would count
    log = open(os.path.join(workdir, "lost.log"), "w+")
    job = subprocess.Popen([ft_train, "--no-faults", "--replicas", "2", "--steps", "100000",
                            "--no-progress", "--out", out], stdout=log, stderr=subprocess.STDOUT)
    try:
        metrics = os.path.join(out, "fault_free.jsonl")
        def committed():
            try:
                with open(metrics) as f:
                    return sum(1 for _ in f) >= 20
            except FileNotFoundError:
                return False
        wait_for("20 committed steps", committed, 60, job)
        children = [p for p in pids() if parent_of(p) == job.pid]
        servers = []
        for p in children:
            with open("/proc/%d/cmdline" % p, "rb") as f:
                if f.read().split(b"\0")[0].endswith(b"ft_train"):
                    servers.append(p)
        if not servers:
            fail("no fork server among ft_train's children %s" % children)
        for p in servers:
            os.kill(p, signal.SIGKILL)
        try:
            rc = job.wait(60)
        except subprocess.TimeoutExpired:
            fail("ft_train still runs 60 s after every group was killed")
        log.seek(0)
        text = log.read()
        if rc == 0 or "every replica group has failed" not in text or "is lost" not in text:
            fail("every group killed: exit %d, output %r" % (rc, text[-3000:]))
        print("every group killed: exit %d: %s" %
              (rc, [l for l in text.splitlines() if "is lost" in l][-1]))
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_lighthouse_after_job(monarch, ft_train, workdir):
    """A job started before its lighthouse says at once that it is waiting, and why (it once
    waited 30 s in silence), then trains once the lighthouse comes up on that address."""
    with socket.socket() as s:  # a free port (nothing listens on it until the lighthouse does)
        s.bind(("127.0.0.1", 0))
        addr = "tcp://127.0.0.1:%d" % s.getsockname()[1]
    summary = os.path.join(workdir, "early_job.json")
    job = subprocess.Popen([ft_train, "--lighthouse", addr, "--replicas", "2", "--steps", "40",
                            "--no-faults", "--no-progress", "--out",
                            os.path.join(workdir, "early_job"), "--json-summary", summary],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lh = None
    try:
        want = "no lighthouse at %s yet (Connection refused)" % addr
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = job.stdout.readline()
            if not line:
                break
            seen.append(line)
            if want in line:
                break
        if not seen or want not in seen[-1]:
            fail("ft_train with no lighthouse at %s: expected a warning saying %r, got %r" %
                 (addr, want, "".join(seen)[-2000:]))
        print("waiting job said: %s" % seen[-1].strip())
        lh = Lighthouse(monarch, addr)
        try:
            rest, _ = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
            fail("ft_train did not finish after its lighthouse came up at %s" % addr)
        if job.returncode != 0:
            fail("ft_train exited %d after its lighthouse came up: %s" %
                 (job.returncode, ("".join(seen) + rest)[-3000:]))
        with open(summary) as f:
            s = json.load(f)
        if not s["replicas_bitwise_equal"] or s["steps"] != 40:
            fail("job started before its lighthouse: %s" % json.dumps(s)[:2000])
        print("job started before its lighthouse: exit 0, 40 steps, replicas equal")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        if lh:
            lh.stop()


def test_jobs(monarch, ft_train, workdir):
    """One lighthouse, several jobs one after the other (Q-10): ft_train's two runs (fault-free,
    then faulty) and a second ft_train, each from step 0, healed and equal. Then a job that can
    never form a quorum ends with an error naming what the lighthouse waits for
    (ft.progress_timeout), not a hang."""
    lh = Lighthouse(monarch, "tcp://127.0.0.1:0")
    try:
        for name, extra in (("two_runs", ["--faults", "2"]), ("second_job", ["--no-faults"])):
            summary = os.path.join(workdir, name + ".json")
            r, out, secs = run_ft_train([ft_train, "--lighthouse", lh.addr, "--replicas", "2",
                                         "--steps", "40", "--json-summary", summary] + extra,
                                        workdir, name)
            if r.returncode != 0:
                fail("%s on a lighthouse that served a job before: exit %d after %.1f s: %s" %
                     (name, r.returncode, secs, out[-3000:]))
            with open(summary) as f:
                s = json.load(f)
            if not s["replicas_bitwise_equal"] or s["steps"] != 40:
                fail("%s: %s" % (name, json.dumps(s)[:2000]))
            if extra[0] == "--faults" and s["faults_injected"] < 1:
                fail("%s injected no fault: %s" % (name, json.dumps(s)[:2000]))
            print("%s: exit 0 in %.1f s, %d fault(s), replicas equal" %
                  (name, secs, s["faults_injected"]))
    finally:
        lh.stop()
    test_lighthouse_after_job(monarch, ft_train, workdir)
    test_all_groups_lost(ft_train, workdir)
    lh = Lighthouse(monarch, "tcp://127.0.0.1:0", extra=["--min-replicas", str(REPLICAS + 2)])
    try:
        env = dict(os.environ, MONARCH_FT_PROGRESS_TIMEOUT="3s")
        r, out, secs = run_ft_train([ft_train, "--lighthouse", lh.addr, "--no-faults", "--steps",
                                     "50", "--replicas", str(REPLICAS)], workdir, "stalled", env)
        want = "min_replicas is %d" % (REPLICAS + 2)
        if r.returncode == 0 or "ft.progress_timeout" not in out or want not in out:
            fail("a job below the lighthouse's min_replicas: exit %d after %.1f s, output %r; "
                 "expected a failure naming ft.progress_timeout and %r" %
                 (r.returncode, secs, out[-2000:], want))
        print("stalled job: exit %d after %.1f s: %s" %
              (r.returncode, secs, [l for l in out.splitlines() if "progress_timeout" in l][0]))
    finally:
        lh.stop()
    print("PASS")


def test_flags(monarch, workdir):
    cases = [
        (["--listen", "garbage"], "bad channel address 'garbage'"),
        (["--listen", "tcp://127.0.0.1:0", "--http", "nope"], "--http 'nope'"),
        (["--listen", "tcp://127.0.0.1:0", "--http", "127.0.0.1:99999"], "bad port"),
        (["--listen", "tcp://127.0.0.1:0", "--secret-file", os.path.join(workdir, "absent")],
         "cannot read --secret-file"),
        (["--listen", "tcp://127.0.0.1:0", "--secret-file", workdir], "is a directory"),
        ([], "--listen is required"),
        (["--listen", "tcp://127.0.0.1:0", "--heartbeat-timeout-ms", "1"],
         "below twice ft.heartbeat_interval"),
    ]
    # A second lighthouse must not share a live one's HTTP port (kills would reach either).
    first = Lighthouse(monarch, "tcp://127.0.0.1:0")
    try:
        cases.append((["--listen", "tcp://127.0.0.1:0", "--http",
                       first.url.split("//", 1)[1]],
                      "cannot bind the HTTP server to %s (Address already in use)" %
                      first.url.split("//", 1)[1]))
        for args, want in cases:
            r = subprocess.run([monarch, "lighthouse"] + args, capture_output=True, text=True,
                               timeout=20)
            if r.returncode == 0 or want not in r.stderr + r.stdout:
                fail("monarch lighthouse %s: exit %d, output %r; expected a failure saying %r" %
                     (" ".join(args), r.returncode, r.stderr + r.stdout, want))
    finally:
        first.stop()
    print("PASS")


def dump_dom(url):
    args = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--user-data-dir=" + os.path.join(WORKDIR, "chromium"),
            "--virtual-time-budget=3000", "--dump-dom", url]
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        fail("chromium did not finish in 60 s")
    if r.returncode != 0 or "<html" not in r.stdout:
        fail("chromium exited %d: %s" % (r.returncode, r.stderr[-2000:]))
    return r.stdout


def dom_until(url, pred, timeout):
    """The page as headless Chromium renders it, rendered again until pred(page) holds or the
    deadline passes (then the last one, for the caller's check to report). The page fills itself
    from /status by script; on a loaded box one render can end before the first answer lands."""
    deadline = time.monotonic() + timeout
    while True:
        page = dump_dom(url)
        if pred(page) or time.monotonic() >= deadline:
            return page
        print("the rendered page does not show it yet; rendering again", flush=True)


def main():
    global WORKDIR
    if len(sys.argv) != 5 or sys.argv[4] not in ("freeze", "http", "chromium", "flags", "jobs"):
        print(__doc__)
        return 2
    monarch, ft_train, WORKDIR, mode = sys.argv[1:]
    os.makedirs(WORKDIR, exist_ok=True)
    secret_file = os.path.join(WORKDIR, "secret")
    with open(secret_file, "w") as f:
        f.write(SECRET + "\n")
    os.environ["MONARCH_SECRET"] = SECRET  # ft_train and its workers dial the TCP lighthouse
    if mode == "flags":
        test_flags(monarch, WORKDIR)
        test_ft_train_flags(ft_train, WORKDIR)
    elif mode == "jobs":
        test_jobs(monarch, ft_train, WORKDIR)
    elif mode == "freeze":
        test_freeze(monarch, ft_train, WORKDIR, secret_file)
    else:
        test_http(monarch, ft_train, WORKDIR, secret_file, chromium=(mode == "chromium"))
    return 0


WORKDIR = None
if __name__ == "__main__":
    sys.exit(main())
