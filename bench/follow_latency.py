#!/usr/bin/env python3
"""How late a followed run's rows arrive over SSH, and how many bytes a minute they take:
`traindeck follow` of a live run read through a real ssh connection, as the desktop app reads it.

Starts its own sshd on a free port of 127.0.0.1 (a temporary host key and key pair, as
tests/engine/test_remote.cpp does; needs openssh-server), trains PROJECT detached on this machine,
follows it through ssh until it ends and prints, for the step rows: the delay from the step's
time (when the trainer logged it; storing it comes after) to the line's arrival here, p50 and
p99, and the stream's bytes per minute.

    python3 bench/follow_latency.py [--traindeck build/traindeck] [--project P] [--epochs N]
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traindeck", default=os.path.join(root, "build", "traindeck"))
    ap.add_argument("--project", default=os.path.join(root, "projects", "fashion_mnist_mlp.json"))
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    if not os.path.exists("/usr/sbin/sshd"):
        sys.exit("follow_latency.py: no /usr/sbin/sshd (apt-get install openssh-server)")
    d = tempfile.mkdtemp(prefix="td-follow-")
    try:
        for key in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/{key}"],
                           check=True)
        shutil.copy(f"{d}/user_key.pub", f"{d}/authorized_keys")
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)
        port = free_port()
        with open(f"{d}/sshd_config", "w") as f:
            f.write(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n"
                    f"AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                    f"PermitRootLogin prohibit-password\nPidFile {d}/sshd.pid\n")
        with open(f"{d}/known_hosts", "w") as f, open(f"{d}/host_key.pub") as k:
            f.write(f"[127.0.0.1]:{port} {k.read()}")
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", f"{d}/sshd_config"],
                                stderr=subprocess.DEVNULL)
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-p", str(port),
               "-i", f"{d}/user_key", "-o", "IdentitiesOnly=yes",
               "-o", f"UserKnownHostsFile={d}/known_hosts", "-o", "LogLevel=ERROR", "127.0.0.1"]
        for _ in range(50):
            if subprocess.run(ssh + ["true"], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        db = f"{d}/runs.db"
        started = subprocess.run([args.traindeck, "train", args.project, "--db", db, "--detach",
                                  "--epochs", str(args.epochs)], capture_output=True, text=True)
        if started.returncode != 0:
            sys.exit(started.stderr)
        run = started.stdout.strip()
        start = time.time()
        follow = subprocess.Popen(ssh + [f"'{args.traindeck}' follow {run} --db '{db}'"],
                                  stdout=subprocess.PIPE)
        delays, total = [], 0
        for line in follow.stdout:
            now = time.time() * 1000
            total += len(line)
            row = json.loads(line)
            if row.get("type") == "step":
                delays.append(now - row["time_ms"])
        follow.wait()
        minutes = (time.time() - start) / 60
        sshd.terminate()
        delays.sort()
        if not delays:
            sys.exit("follow_latency.py: no step rows arrived")
        p50 = delays[len(delays) // 2]
        p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
        print(f"{len(delays)} step rows over ssh: delay from the step's time to arrival "
              f"p50 {p50:.0f} ms, p99 {p99:.0f} ms; {total / minutes / 1024:.1f} KiB a minute "
              f"({total} bytes in {minutes * 60:.1f} s)")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
