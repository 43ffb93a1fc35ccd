"""Rules every wing applies the same way: which addresses are loopback, which settings hold
secrets (docs/cluster.md §2.2).

A Spark setting reaches the driver JVM's command line (pyspark passes each as ``--conf k=v``
to spark-submit, which every user of the host reads with ``ps``) and the run's records
(``effective_config.yaml``, manifests, the stage's argv). So a setting whose *name* says it
holds a secret is refused before anything is written or started, whatever its value.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from dlrm_contracts.errors import UsageError

# A name component (between dots), lower-cased without '-' and '_', that holds one of these
# is a secret: spark.ssl.keyStorePassword, fs.s3a.secret.key, ...oauthToken, JWSFilter's
# param.secretKey, executorEnv.AWS_SECRET_ACCESS_KEY.
_SECRET_WORDS = ("secret", "password", "passwd", "token", "credential")
# ... or is "key" / ends in "key": fs.s3a.access.key, fs.azure.account.key.<account>...,
# ...private.key, apikey.
_KEY = re.compile(r"(^|[a-z0-9])key$")
# A last component naming a file, a size or a switch, not the secret itself:
# spark.authenticate.secretBitLength, ...oauthTokenFile, ...credential.provider.path,
# spark.security.credentials.hive.enabled.
_NOT_A_VALUE = re.compile(r"(file|path|dir|length|bits|size|algorithm|iterations|enabled|type"
                          r"|class|regex|provider)$")
# Kubernetes settings that name a Secret object (mounted or referenced), never its content.
_KUBERNETES_REFERENCE = re.compile(r"^spark\.kubernetes\.(driver|executor)\.(secrets|secretKeyRef)\.")


def secret_setting(name: str) -> bool:
    """Whether a setting's name says its value is a secret (see the module docstring)."""
    if _KUBERNETES_REFERENCE.match(name):
        return False
    parts = [re.sub(r"[-_]", "", part.lower()) for part in name.split(".")]
    if not parts or _NOT_A_VALUE.search(parts[-1]):
        return False
    return any(word in part or _KEY.search(part) for part in parts for word in _SECRET_WORDS)


class SecretSettingError(UsageError, ValueError):
    """A setting whose name says it holds a secret, given where settings are recorded."""


def refuse_secret_settings(names, where: str) -> None:
    """Refuse (exit 2) the first setting whose name says it holds a secret; the message names
    the setting and never its value."""
    for name in names:
        if secret_setting(str(name)):
            raise SecretSettingError(
                f"{where}: {name} looks like a secret (by its name): Spark settings reach the "
                "JVM's command line, which every user of the machine reads with ps, and the "
                "run's records (effective_config.yaml, manifests), so none may hold one. A "
                "cluster's shared secret goes in a file of mode 0600 named by "
                "--spark-secret-file (spark.auth_secret_file; python -m spark_jobs: "
                "--auth-secret-file); docs/cluster.md §2.2")


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` stands for is a loopback one. A name that does not
    resolve counts as routable: when in doubt, the cluster authenticates."""
    try:
        return _loopback_address(host)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {info[4][0].split("%", 1)[0] for info in infos}
    return bool(addresses) and all(_loopback_address(a) for a in addresses)


def _loopback_address(text: str) -> bool:
    """An IP address's loopback-ness, IPv4-mapped IPv6 (::ffff:127.0.0.1) included."""
    ip = ipaddress.ip_address(text)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback
