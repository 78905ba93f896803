#!/usr/bin/env python3
"""Static checks of deploy/docker/Dockerfile{,.gpu} (no Docker engine here to build them).

  check_dockerfiles.py REPO_ROOT

For each Dockerfile: multi-stage; every COPY source (from the build context) exists; the
presets and targets it builds exist in CMakePresets.json / CMakeLists.txt and the binaries it
installs are where those presets put them; the final stage runs as a numeric non-root user and
EXPOSEs 50051 and 9464; ENTRYPOINT is kvcached; the final stage runs RUN steps through
/bin/bash (the readiness probe's shell). For apt-get install lines in a Debian 12 stage,
every package must be known to this Debian 12 machine's apt-cache (skipped without apt-cache;
NVIDIA's cuda-* packages are not in Debian and are not checked).
"""
import json
import os
import re
import shutil
import subprocess
import sys

root = sys.argv[1]
problems = []


def problem(where, msg):
    problems.append(f"{where}: {msg}")


def instructions(text):
    text = re.sub(r"\\\n", " ", text)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


presets = json.load(open(os.path.join(root, "CMakePresets.json")))
binary_dirs = {p["name"]: p.get("binaryDir", "${sourceDir}/build").replace("${sourceDir}/", "")
               for p in presets["configurePresets"]}
for p in presets["configurePresets"]:
    if p["name"] not in ("default",) and "binaryDir" not in p and p.get("inherits") in binary_dirs:
        binary_dirs[p["name"]] = binary_dirs[p["inherits"]]
targets = {}
for cm in ("cachesvc/CMakeLists.txt", "client/CMakeLists.txt"):
    for t in re.findall(r"add_executable\(([\w-]+)", open(os.path.join(root, cm)).read()):
        targets[t] = os.path.dirname(cm)

for name in ("Dockerfile", "Dockerfile.gpu"):
    path = os.path.join(root, "deploy/docker", name)
    where = f"deploy/docker/{name}"
    ins = list(instructions(open(path).read()))
    stages = [rest for word, rest in ins if word == "FROM"]
    if len(stages) < 2:
        problem(where, "not multi-stage")
    final = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    stage_base = None
    for i, (word, rest) in enumerate(ins):
        if word == "FROM":
            stage_base = rest.split()[0]
        if word in ("COPY", "ADD") and "--from=" not in rest and not re.search(r"https?://", rest):
            srcs = rest.split()[:-1]
            for s in srcs:
                if not s.startswith("--") and not os.path.exists(os.path.join(root, s)):
                    problem(where, f"{word} source {s} does not exist in the build context")
        if word == "RUN":
            for preset in re.findall(r"cmake --preset (\w+)", rest):
                if preset not in binary_dirs:
                    problem(where, f"unknown CMake preset {preset}")
            for preset, tlist in re.findall(r"cmake --build --preset (\w+) --target ([\w -]+?)(?: &&|$)", rest):
                for t in tlist.split():
                    if t not in targets:
                        problem(where, f"unknown target {t}")
                    elif f"{binary_dirs[preset]}/{targets[t]}/{t}" not in rest:
                        problem(where, f"does not install {binary_dirs[preset]}/{targets[t]}/{t}")
            m = re.search(r"apt-get install ([^&;|]+)", rest)
            if m and stage_base and stage_base.startswith("debian:12") and shutil.which("apt-cache"):
                for pkg in m.group(1).split():
                    if pkg.startswith("-"):
                        continue
                    if pkg.startswith("cuda-"):  # NVIDIA's debian12 repository, not Debian's
                        print(f"{where}: note: {pkg} comes from NVIDIA's repository, not checked")
                        continue
                    r = subprocess.run(["apt-cache", "show", "--no-all-versions", pkg], capture_output=True)
                    if r.returncode != 0 or not r.stdout:
                        problem(where, f"Debian 12 has no package {pkg}")
    final_ins = ins[final:]
    users = [rest for w, rest in final_ins if w == "USER"]
    if not users or not re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]):
        problem(where, f"final stage must set a numeric non-root USER (got {users})")
    exposed = " ".join(rest for w, rest in final_ins if w == "EXPOSE").split()
    for port in ("50051", "9464"):
        if port not in exposed:
            problem(where, f"final stage does not EXPOSE {port}")
    # The StatefulSet's readiness probe is `/bin/bash -c ...` (bash's /dev/tcp, grep): a final
    # stage whose RUN steps go through /bin/bash proves at build time that the image has it.
    shells = [rest for w, rest in final_ins if w == "SHELL"]
    if not shells or json.loads(shells[-1])[0] != "/bin/bash" or not any(w == "RUN" for w, _ in final_ins):
        problem(where, "final stage must RUN through SHELL [\"/bin/bash\", ...] (the readiness probe needs bash)")
    ep = [rest for w, rest in final_ins if w == "ENTRYPOINT"]
    if not ep or json.loads(ep[-1])[0] != "/usr/local/bin/kvcached":
        problem(where, "ENTRYPOINT must be /usr/local/bin/kvcached (exec form)")
    if not problems:
        print(f"{where}: ok ({len(stages)} stages: {', '.join(s.split()[0] for s in stages)})")

for p in problems:
    print(f"FAIL: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
