#!/usr/bin/env python3
"""`k8s_launch --job ft_train --render` renders the fault-tolerant job for Kubernetes.

  k8s_render_test.py K8S_LAUNCH FT_TRAIN

Checks the rendered manifests (JSON List; the YAML stream has the same documents): RBAC for the
controller (ServiceAccount, Role on jobs/services/pods, RoleBinding), the controller Job running
`ft_train --launcher kubernetes` with the replica count, image, secret, its pod IP as client
address and the extra ft_train arguments, and one agent Job (one pod, completionMode Indexed,
`monarch agent` on the pod IP) plus headless Service per replica group. Every flag of the
controller's command line must be one ft_train accepts (its --help), and bad input is refused.
"""
import json
import subprocess
import sys


def run(argv, ok=True):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if ok and r.returncode != 0:
        sys.exit("FAIL: %s exited %d: %s" % (argv, r.returncode, r.stderr))
    return r


def main():
    k8s, ft_train = sys.argv[1], sys.argv[2]
    problems = []

    def check(cond, what):
        if not cond:
            problems.append(what)

    base = [k8s, "--job", "ft_train", "--name", "ft", "--namespace", "train", "--image",
            "registry.example.com/monarch:1", "--replicas", "3", "--secret", "monarch-secret",
            "--gpus", "1", "--render"]
    extra = ["--", "--steps", "500", "--seed", "3"]
    doc = json.loads(run(base + ["--render-format", "json"] + extra).stdout)
    items = doc["items"]
    kinds = [(i["kind"], i["metadata"]["name"]) for i in items]
    want = [("ServiceAccount", "ft-controller"), ("Role", "ft-controller"),
            ("RoleBinding", "ft-controller"), ("Job", "ft-controller")]
    for g in range(3):
        want += [("Service", "ft-g%d" % g), ("Job", "ft-g%d" % g)]
    check(kinds == want, "documents %s, want %s" % (kinds, want))
    for i in items:
        check(i["metadata"].get("namespace") == "train", "%s not in namespace train" % (i["kind"],))

    yaml = run(base + extra).stdout
    ndocs = sum(1 for line in yaml.splitlines() if line.startswith("kind: "))
    check(ndocs == len(items), "YAML has %d documents, JSON %d" % (ndocs, len(items)))

    by = {(i["kind"], i["metadata"]["name"]): i for i in items}
    role = by.get(("Role", "ft-controller"), {})
    resources = {r for rule in role.get("rules", []) for r in rule["resources"]}
    check({"jobs", "services", "pods"} <= resources, "Role covers only %s" % sorted(resources))
    binding = by.get(("RoleBinding", "ft-controller"), {})
    check(binding.get("subjects", [{}])[0].get("name") == "ft-controller", "RoleBinding subject")

    ctl = by.get(("Job", "ft-controller"), {})
    pod = ctl.get("spec", {}).get("template", {}).get("spec", {})
    check(pod.get("serviceAccountName") == "ft-controller", "controller pod's service account")
    check(pod.get("restartPolicy") == "Never", "controller restartPolicy")
    c = pod.get("containers", [{}])[0]
    cmd = c.get("command", [])
    text = " ".join(cmd)
    for part in ["ft_train --launcher kubernetes", "--k8s-name ft", "--k8s-namespace train",
                 "--k8s-image registry.example.com/monarch:1", "--replicas 3",
                 "--k8s-secret monarch-secret", "--k8s-gpus 1",
                 "--client-listen tcp://$(MONARCH_POD_IP):0"]:
        check(part in text, "controller command lacks '%s': %s" % (part, text))
    check(cmd[-4:] == ["--steps", "500", "--seed", "3"], "extra ft_train args not last: %s" % cmd)
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("MONARCH_POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "status.podIP", "controller has no MONARCH_POD_IP from status.podIP")
    check(c.get("envFrom") == [{"secretRef": {"name": "monarch-secret"}}], "controller envFrom")

    for g in range(3):
        job = by.get(("Job", "ft-g%d" % g), {})
        spec = job.get("spec", {})
        check(spec.get("completions") == 1 and spec.get("parallelism") == 1,
              "ft-g%d is not one pod" % g)
        check(spec.get("completionMode") == "Indexed", "ft-g%d not Indexed" % g)
        ac = spec.get("template", {}).get("spec", {}).get("containers", [{}])[0]
        check("agent" in ac.get("command", []), "ft-g%d does not run monarch agent" % g)
        check(ac.get("image") == "registry.example.com/monarch:1", "ft-g%d image" % g)
        check(ac.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") in (1, "1"),
              "ft-g%d gpu limit: %s" % (g, ac.get("resources")))

    # Every flag of the controller's command line is one ft_train knows.
    helptext = run([ft_train, "--help"]).stdout
    for a in cmd[1:]:
        if a.startswith("--") and a not in helptext:
            problems.append("ft_train has no flag %s" % a)

    # Bad input is refused with a message, not rendered.
    r = run([k8s, "--job", "ft_train", "--name", "ft", "--image", "i", "--replicas", "2"], ok=False)
    check(r.returncode == 2 and "only renders" in r.stderr,
          "--job ft_train without --render: %d %s" % (r.returncode, r.stderr))
    r = run([k8s, "--job", "ft_train", "--name", "Bad_Name", "--image", "i", "--render"], ok=False)
    check(r.returncode != 0 and "name" in r.stderr, "a bad name rendered: %s" % r.stderr)
    # -1 pods once rendered as completions: 18446744073709551615.
    for flag, value, want in [("--replicas", "-1", "--replicas: must be from 1 to 100000, not -1"),
                              ("--port", "70000", "--port: must be from 1 to 65535, not 70000"),
                              ("--procs", "0", "--procs: must be from 1 to 1024, not 0")]:
        r = run([k8s, "--name", "ok", "--image", "i", "--render", flag, value], ok=False)
        check(r.returncode != 0 and want in r.stderr and not r.stdout,
              "%s %s: exit %d, stderr %r, stdout %d bytes" %
              (flag, value, r.returncode, r.stderr, len(r.stdout)))
    r = run([ft_train, "--launcher", "kubernetes", "--steps", "1"], ok=False)
    check(r.returncode != 0 and "--k8s-image" in r.stderr, "ft_train without --k8s-image: %s"
          % r.stderr)

    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("k8s render (ft_train, 3 groups, %d documents): PASS" % len(items))


if __name__ == "__main__":
    main()
