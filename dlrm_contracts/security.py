"""Rules every wing applies the same way: which addresses are loopback, which settings hold
secrets (docs/cluster.md §2.2).

A Spark setting reaches the driver JVM's command line (pyspark passes each as ``--conf k=v``
to spark-submit, which every user of the host reads with ``ps``) and the run's records
(``effective_config.yaml``, manifests, the stage's argv). So a setting whose *name* says it
holds a secret is refused before anything is written or started, whatever its value; so is a
setting whose *value* carries one: a secret setting passed inside it
(``spark.driver.extraJavaOptions: -Dspark.authenticate.secret=...``, ``DB_PASSWORD=...``) or a
URL with a password (``s3a://key:secret@bucket/...``, an event-log URL). The messages name the
setting and the kind of secret, never the value.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Iterator, Mapping

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
_NOT_A_VALUE = re.compile(
    r"(file|path|dir|length|bits|size|algorithm|iterations|enabled|type"
    r"|class|regex|provider)$"
)
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


# A URL's user information with a password: scheme://user:password@host (s3a://key:secret@...).
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s@:]*:[^/?#\s@]+@")
# A setting passed inside a value: NAME=VALUE, -DNAME=VALUE or --NAME=VALUE at the start of the
# value or after a blank or separator (JVM options, environment assignments, option strings).
_ASSIGNMENT = re.compile(r"(?:^|[\s,;'\"])(?:-D|--)?([A-Za-z_][\w.-]*)=(?=[^\s,;'\"])")


def secret_in_value(value: str) -> str | None:
    """What secret a setting's value carries (a sentence naming its kind, never the secret),
    or None: a secret setting assigned inside it, or a URL with a password."""
    text = str(value)
    for match in _ASSIGNMENT.finditer(text):
        if secret_setting(match.group(1)):
            return f"passes {match.group(1)}, a secret by its name, inside its value"
    if _URL_PASSWORD.search(text):
        return "holds a URL with a password (scheme://user:password@host)"
    return None


class SecretSettingError(UsageError, ValueError):
    """A setting whose name or value says it holds a secret, given where settings are
    recorded."""


_WHY = (
    "Spark settings reach the JVM's command line, which every user of the machine reads "
    "with ps, and the run's records (effective_config.yaml, manifests, logs), so none may "
    "hold one. A cluster's shared secret goes in a file of mode 0600 named by "
    "--spark-secret-file (spark.auth_secret_file; python -m spark_jobs: "
    "--auth-secret-file); storage credentials belong in the environment's credential "
    "providers (instance roles, a Hadoop credential store), not in a setting or URL; "
    "docs/cluster.md §2.2"
)


def refuse_secret_settings(settings: Mapping[str, object] | Iterable[str], where: str) -> None:
    """Refuse (exit 2) the first setting whose name says it holds a secret or, given a mapping,
    whose value carries one (``secret_in_value``); the message names the setting and never
    its value."""
    items: Iterable[tuple[str, object]] = (
        settings.items() if isinstance(settings, Mapping) else ((n, None) for n in settings)
    )
    for name, value in items:
        if secret_setting(str(name)):
            raise SecretSettingError(f"{where}: {name} looks like a secret (by its name): {_WHY}")
        why = None if value is None else secret_in_value(str(value))
        if why:
            raise SecretSettingError(f"{where}: {name} {why}: {_WHY}")


def refuse_secret_values(values: Mapping[str, object], where: str) -> None:
    """Refuse a URL with a password in any string of a nested record (a whole configuration as
    written to effective_config.yaml): paths and URLs are recorded and passed on command
    lines like settings are."""
    for key, value in values.items():
        for path, text in _strings(value, f"{where}.{key}"):
            if _URL_PASSWORD.search(text):
                raise SecretSettingError(
                    f"{path} holds a URL with a password (scheme://user:password@host): {_WHY}"
                )


def _strings(value: object, path: str) -> Iterator[tuple[str, str]]:
    """(dotted path, text) of every string in a nested mapping or list."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]")


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
    addresses = {str(info[4][0]).split("%", 1)[0] for info in infos}
    return bool(addresses) and all(_loopback_address(a) for a in addresses)


def _loopback_address(text: str) -> bool:
    """An IP address's loopback-ness, IPv4-mapped IPv6 (::ffff:127.0.0.1) included."""
    ip = ipaddress.ip_address(text)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback
