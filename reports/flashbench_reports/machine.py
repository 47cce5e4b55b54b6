"""Which machine a results file was measured on: context.machine (flashbench run/tune, the paired gate).

context.machine = {host_id, host_id_source ("machine-id" | "boot-id"), host_name, gpu_uuid, gpu_serial,
pci_bus_id, driver, vbios, power_limit_w, ecc ("on" | "off" | null), source ("nvml" | "nvidia-smi" | "none"),
reason, start: {sm_clock_mhz, mem_clock_mhz, temperature_c, power_w}, end: {...}}; any field may be null.
Files written before it existed carry none of it: then two files may or may not come from one host, and the
readers say so instead of guessing.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

SAME, DIFFERENT, UNKNOWN = "same", "different", "unknown"


def of(context: Dict[str, Any]) -> Dict[str, Any]:
    m = context.get("machine")
    return m if isinstance(m, dict) else {}


def host_label(context: Dict[str, Any]) -> str:
    """Short label of the machine: GPU UUID tail and host id prefix, or '?' when the file carries neither."""
    m = of(context)
    uuid, host = m.get("gpu_uuid"), m.get("host_id")
    parts = []
    if isinstance(uuid, str) and uuid:
        parts.append(uuid[-8:] if len(uuid) > 8 else uuid)
    if isinstance(host, str) and host:
        parts.append("host " + host[:8])
    return " ".join(parts) or "?"


def relation(a: Dict[str, Any], b: Dict[str, Any]) -> Tuple[str, str]:
    """(same | different | unknown, why) for the machines of two results contexts. The GPU UUID decides where both
    files have one; else the host id; a file with neither leaves it unknown."""
    ma, mb = of(a), of(b)
    for field, what in (("gpu_uuid", "GPU"), ("host_id", "host")):
        va, vb = ma.get(field), mb.get(field)
        if isinstance(va, str) and va and isinstance(vb, str) and vb:
            if va == vb:
                if field == "gpu_uuid":
                    return SAME, "same GPU ({})".format(va)
                return SAME, "same host ({}), GPU UUID not recorded".format(va[:12])
            return DIFFERENT, "different {}s ({} vs {})".format(what, va[:20], vb[:20])
    return UNKNOWN, "the files carry no GPU UUID or host id (written before machine identity was recorded)"


def host_key(context: Dict[str, Any]) -> Optional[str]:
    """What history groups runs by to see a host change: GPU UUID, else host id, else None."""
    m = of(context)
    for f in ("gpu_uuid", "host_id"):
        v = m.get(f)
        if isinstance(v, str) and v:
            return v
    return None
