"""Test certificates made with the openssl command line (Debian's openssl)."""
import os
import subprocess


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1/localhost, a client
    certificate (CN=alice) and a cluster node's certificate (server and
    client, for 127.0.0.1) signed by it, and a second CA no one trusts with
    a node certificate of its own (rogue-node)."""
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={ca}",
                "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    # X.509 v3 (an extension makes it one): webpki takes no v1 certificate.
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    with open(os.path.join(d, "node.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
    subjects = {"server": "localhost", "client": "alice", "node": "node", "rogue-node": "node"}
    for name, ext, ca in (("server", "server.ext", "ca"), ("client", "client.ext", "ca"), ("node", "node.ext", "ca"),
                          ("rogue-node", "node.ext", "other-ca")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={subjects[name]}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
                "-days", "2", "-out", f"{name}.pem", "-extfile", ext, cwd=d)
    return {n: os.path.join(d, n) for n in os.listdir(d)}
