"""One measured run in a fresh process (so that peak RSS is the run's own).

Usage: python -m gwpolicy.bench.child parse|parse_fastest|phases FILE RESULT.json
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import time


def parse(path: str) -> dict[str, float]:
    """The baseline: PyYAML's C loader alone, as a user of PyYAML would call it."""
    import yaml

    t, c = time.perf_counter(), time.process_time()
    with open(path, encoding="utf-8") as fh:
        docs = list(yaml.load_all(fh.read(), Loader=yaml.CSafeLoader))
    return {"parse": time.perf_counter() - t, "parse_cpu": time.process_time() - c, "objects": float(len(docs))}


def parse_fastest(path: str) -> dict[str, float]:
    """The fastest reader of YAML into Python objects here: rapidyaml's parse (in place, into a tree
    made large enough) and its JSON, then orjson; the fast path's own steps without its checks."""
    import orjson

    from gwpolicy.files.yamlfast import parse_to_json

    t, c = time.perf_counter(), time.process_time()
    with open(path, "rb") as fh:
        parsed = parse_to_json(bytearray(fh.read()))
    assert parsed is not None
    docs = orjson.loads(parsed[0])
    return {"parse": time.perf_counter() - t, "parse_cpu": time.process_time() - c, "objects": float(len(docs))}


def phases(path: str) -> dict[str, float]:
    """What `gwpolicy effective` and `gwpolicy status` do, phase by phase."""
    gc.disable()  # as the CLI does
    from gwpolicy.engine.analysis import analyse
    from gwpolicy.files.load import load_paths
    from gwpolicy.files.output import status_list, write_effective

    out: dict[str, float] = {}
    t = time.perf_counter()
    loaded = load_paths([path])
    out["load"] = time.perf_counter() - t
    a = analyse(loaded.objects, loaded.origins, now="2026-01-01T00:00:00Z", timings=out)
    t = time.perf_counter()
    with open("/dev/null", "wb") as sink:
        write_effective(a, sink, "json")
    out["output"] = time.perf_counter() - t
    t = time.perf_counter()
    changes = status_list(a)["items"]
    out["status"] = time.perf_counter() - t
    out["items"] = float(len(a.effective))
    out["status_items"] = float(len(changes))
    return out


def main() -> None:
    mode, path, result = sys.argv[1:4]
    t = time.perf_counter()
    data = {"parse": parse, "parse_fastest": parse_fastest, "phases": phases}[mode](path)
    data["wall"] = time.perf_counter() - t
    data["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(result, "w", encoding="utf-8") as fh:
        json.dump(data, fh)


if __name__ == "__main__":
    main()
