"""The transitdata `mqtt-raw` envelope for the Python tools, decoded and
encoded with Python's protobuf and a module protoc generates now from the
project's proto/transitdata.proto: independently of firstseen's encoder."""
import os
import subprocess
import sys
import tempfile

_module = None


def module():
    """transitdata_pb2, generated on first use."""
    global _module
    if _module is None:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = tempfile.mkdtemp(prefix="firstseen-proto-")
        subprocess.run(["protoc", "-I", os.path.join(repo, "proto"), "--python_out", out,
                        "transitdata.proto"], check=True)
        sys.path.insert(0, out)
        import transitdata_pb2
        _module = transitdata_pb2
    return _module
