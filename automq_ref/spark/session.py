"""The Spark session of the commands (``verify``, the Spark benchmark): quiet unless asked.

Left to itself, a local Spark session prints, before any work, the JVM's own warning about
incubator modules, "Using Spark's default log4j profile", the shell's "Setting default log level"
banner and log4j WARN lines (NativeCodeLoader and others), then a console progress bar per stage.
None of it is about the check. A quiet session (the default) silences it where it starts:

- log4j: a configuration file given to the driver JVM with ``-Dlog4j2.configurationFile`` (through
  ``spark.driver.extraJavaOptions``, which spark-submit applies when it starts the driver)
  sends only ERROR and above to stderr. With a configuration of its own, Spark no longer loads
  its default profile (so it does not announce it); the logger named
  ``org.apache.spark.api.python.PythonGatewayServer`` being configured too, at the same level
  as the root, is what keeps the shell's log-level banner away.
- the JVM's own ``WARNING:`` lines are printed by the JVM before log4j exists, so the driver's
  stderr goes through a pipe whose reader drops them and passes every other line on.
- ``spark.ui.showConsoleProgress`` is off: the command shows its own progress line.

``verbose=True`` leaves Spark as it is: its default log4j profile, its WARN lines and its stage
progress bars. Errors (log4j ERROR, a failing Python worker's traceback) come through either way.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# ERROR and above, on stderr, in Spark's own line format. The PythonGatewayServer logger is the
# one whose configured level Spark compares with the root's before printing its banner.
QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""
# The JVM's own warnings (incubator modules, deprecated Unsafe methods) start so; log4j's lines
# start with a date.
JVM_WARNING = b"WARNING: "


def spark_session(
    master: str, *, verbose: bool = False, app_name: str = "automq-ref verify"
) -> SparkSession:
    """A session on ``master``, bound to 127.0.0.1 unless SPARK_LOCAL_IP says otherwise, with
    Python workers on this interpreter unless PYSPARK_PYTHON says otherwise; quiet unless
    ``verbose``. An active session is returned as it is."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName(app_name)
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "true" if verbose else "false")
        .set("spark.sql.shuffle.partitions", "16")
        .set("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
    )
    # Verbose, or a JVM already running in this process (a context, or one stopped but whose
    # gateway lives on): Spark's own way, reusing that JVM rather than starting an idle second.
    if verbose or SparkContext._gateway is not None:
        builder: Any = SparkSession.builder
        session: SparkSession = builder.config(conf=conf).getOrCreate()
        return session
    with tempfile.TemporaryDirectory(prefix="automq-ref-spark-") as directory:
        # The driver reads the file while it starts; it is not needed after.
        properties = Path(directory) / "log4j2-quiet.properties"
        properties.write_text(QUIET_LOG4J2)
        conf.set("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={properties}")
        context = SparkContext(conf=conf, gateway=_quiet_gateway(conf))
    return SparkSession(context)


def _quiet_gateway(conf: Any) -> Any:
    """Start the driver JVM with its stderr through a filter (see the module docstring). Popen
    gets the write end of a pipe whose reader already runs, rather than ``subprocess.PIPE``
    read afterwards: a JVM that fails at start-up still gets its reason through."""
    from pyspark.java_gateway import launch_gateway

    reader, writer = os.pipe()
    threading.Thread(
        target=_pass_on, args=(os.fdopen(reader, "rb"),), name="spark-stderr", daemon=True
    ).start()
    try:
        return launch_gateway(conf, popen_kwargs={"stderr": writer})  # type: ignore[no-untyped-call]
    finally:
        os.close(writer)  # the JVM holds its own copy; the reader sees EOF when it exits


def _pass_on(lines: BinaryIO) -> None:
    """Copy the JVM's stderr to ours, less the JVM's own warnings."""
    with lines:
        for line in lines:
            if line.startswith(JVM_WARNING):
                continue
            try:
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is gone: keep draining the pipe
                pass
