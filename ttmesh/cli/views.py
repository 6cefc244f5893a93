"""Text views of ttmesh's documents: the same content as ``--json``, for a person.

Each function turns a command's data into text; tables go through :func:`ttmesh.render.table`
(rich on a terminal, plain columns when piped).
"""

from __future__ import annotations

from typing import Any

from ttmesh.render import plural, table


def lease_cell(lease: dict | None) -> str:
    """A chip's lease in a table: its job and user, or who holds the lease file locked."""
    if not lease:
        return "-"
    if lease["verified"]:
        return f"{lease['job']} ({lease['user']})"
    if lease["pid"] is None:
        return "locked (not a lease)"
    return f"locked: pid {lease['pid']} ({lease['user'] or '?'}), not a lease"


def ls_text(data: dict) -> str:
    rows = []
    bdf_of = {c["asic_id"]: c["bdf"] for c in data["chips"]}
    for c in data["chips"]:
        if c["holders"] is None:
            held = "unknown"
        else:
            held = ",".join(str(h["pid"]) for h in c["holders"]) or "-"
        lease = c["lease"]
        rows.append(
            [
                "-" if c["dev_index"] is None else c["dev_index"],
                c["bdf"] or f"remote via {bdf_of.get(c['via'])}",
                c["asic_id"],
                c["board_type"],
                c["arch"],
                f"{c['dram_mb'] // 1024} GB",
                c["heartbeat"],
                held,
                lease_cell(lease),
            ]
        )
    out = [
        table(
            ["DEV", "PCI", "ASIC", "BOARD", "ARCH", "DRAM", "HEARTBEAT", "HELD BY", "LEASE"], rows
        )
    ]
    states: dict[str, int] = {}
    for link in data["links"]:
        states[link["state"]] = states.get(link["state"], 0) + 1
    named = [c for c in data["chips"] if c.get("by_id")]
    if named:
        out.append("\n/dev/tenstorrent/by-id (the driver's stable names, for --chips):")
        out.extend(f"  {c['by_id']}  {c['bdf']}" for c in named)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none known"
    out.append(f"\nEthernet links: {summary}")
    for link in data["links"]:
        if link["state"] != "up":
            a, b = link["a"], link["b"]
            out.append(
                f"  {link['state']}: {a['asic_id']} ch{a['chan']} <-> {b['asic_id']} ch{b['chan']}"
            )
    cables = data.get("cables") or []
    if cables:
        counts: dict[str, int] = {}
        for c in cables:
            counts[c["state"]] = counts.get(c["state"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        out.append(f"Cables to other hosts: {summary} (this end; ttmesh ls --hosts: both ends)")
        for c in cables:
            if c["state"] != "up":
                peer = c["peer"]
                out.append(
                    f"  {c['state']}: {c['bdf'] or c['asic_id']} ch{c['chan']} <-> "
                    f"{peer['asic_id']} ch{peer['chan']} (on another host)"
                )
    out.extend(_domains_text(data, bdf_of))
    for note in data["notes"]:
        out.append(f"note: {note}")
    for asic in data["missing"]:
        out.append(f"missing: chip {asic} is in the topology but not on the host")
    return "\n".join(out)


def _domains_text(data: dict, bdf_of: dict) -> list[str]:
    """``ttmesh ls``'s reset domains (what one reset takes, the links it downs) and the links
    a reset left down beside another job."""
    doms = data.get("reset_domains") or []
    out = (
        [f"\nReset domains ({len(doms)}): what one reset takes, and the links it downs"]
        if doms
        else []
    )
    for d in doms:
        names = [bdf_of.get(a) or f"remote {a}" for a in d["chips"]]
        border = sum(1 for lk in d["links"] if not lk["inside"])
        inside = len(d["links"]) - border
        chips = ", ".join(names) if len(names) <= 4 else f"{plural(len(names), 'chip')}"
        out.append(
            f"  {d['command']}: {chips}; downs {plural(inside, 'link')} inside, "
            f"{plural(border, 'link')} to other chips"
        )
    for e in data.get("links_left_down") or []:
        a, b = bdf_of.get(e["a"]) or e["a"], bdf_of.get(e["b"]) or e["b"]
        out.append(
            f"left down: {plural(len(e['chans']), 'link')} between {a} and {b} ({e['why']}): "
            "the next job on both resets them first"
        )
    return out


def plan_text(data: dict) -> str:
    if data.get("chipless"):
        return _chipless_text(data)
    addr = data["master"]["addr"]
    addr = f"[{addr}]" if ":" in addr else addr  # an IPv6 address, as an endpoint is written
    lines = [
        f"job {data['job']}: layout {data['layout']}, mesh {data['mesh_shape'][0]}x{data['mesh_shape'][1]}, "
        f"symmetric DRAM {data['symmetric_dram_mb']} MB per chip, master {addr}:{data['master']['port']}"
    ]
    if data["grouping"]:
        lines.append(data["grouping"])
    rows = [
        [
            r["rank"],
            ",".join(r["bdfs"]),
            ",".join(r["chips"]),
            "x".join(map(str, r["coord"])),
            r["host_rank"],
            " ".join(r["argv"]),
        ]
        for r in data["ranks"]
    ]
    headers = ["RANK", "PCI", "CHIPS", "COORD", "HOST RANK", "COMMAND"]
    if data.get("hosts"):  # a mesh over several hosts: where each rank runs
        headers.insert(1, "HOST")
        for row, r in zip(rows, data["ranks"], strict=True):
            row.insert(1, r.get("host", "?"))
    lines.append(table(headers, rows))
    for name, path in data["descriptors"].items():
        lines.append(f"descriptor {name}: {path}")
    lines.append("environment of rank 0 (what ttmesh sets):")
    for key, value in sorted(data["ranks"][0]["env"].items()):
        lines.append(f"  {key}={value}")
    if data.get("serving"):
        lines += serving_lines(data["serving"])
    lines += [f"note: {n}" for n in data.get("notes", [])]
    for p in data.get("passed_over", []):
        lines.append(f"passed over {', '.join(p['chips'])}: {p['why']}")
    for c in data.get("checks", []):
        lines.append(
            f"check {c['check']}: {c['result']}" + (f" ({c['detail']})" if c.get("detail") else "")
        )
    return "\n".join(lines)


def _chipless_text(data: dict) -> str:
    """A server that drives no Tenstorrent chip: its command and environment, no mesh."""
    (rank,) = data["ranks"]
    lines = [
        f"job {data['job']}: chipless (the server drives no Tenstorrent chip)",
        f"command: {' '.join(rank['argv'])}",
        "environment (what ttmesh sets):",
    ]
    lines += [f"  {key}={value}" for key, value in sorted(rank["env"].items())]
    return "\n".join(lines + serving_lines(data["serving"]))


def serving_lines(serving: dict[str, Any]) -> list[str]:
    """A server's part of a plan: profile, where it answers, rules' findings, memory."""
    out = [
        f"server: {serving['profile']} ({serving['title']}), {serving['process_model']}",
        f"  ready when {serving['health']} answers 200 (within {serving['ready_timeout']:g} s); "
        f"stop: SIGTERM, {serving['grace']:g} s to drain, then the whole tree",
    ]
    out += [f"  note: {n}" for n in serving["notes"]]
    out += [f"  {f['severity']}: {f['message']} (fix: {f['fix']})" for f in serving["findings"]]
    flags = serving.get("flags")
    if flags:
        config = f", with --config {flags['config']} merged first" if flags["config"] else ""
        out.append(f"  flags, read with the flag table of {flags['parser']}{config}:")
        for r in flags["read"]:
            value = r["value"]
            if r["kind"] in ("store_true", "store_false", "boolean_optional"):
                said = r["option"]  # the spelling that decided it (--x or --no-x)
            else:
                said = f"{r['flag']} " + (
                    " ".join(map(str, value)) if isinstance(value, list) else str(value)
                )
            times = (
                f" (given {len(r['given'])} times: {', '.join(r['given'])})"
                if len(r["given"]) > 1
                else ""
            )
            out.append(f"    {said}{times}")
        if flags["unread"]:
            out.append(f"    not in ttmesh's table (passed on unread): {' '.join(flags['unread'])}")
    memory = serving.get("memory")
    if memory:
        rows = [
            ["DRAM per chip", f"{memory['chip_gb'] * 1e9 / 2**30:.0f} GiB = {memory['chip_gb']:.1f} GB"],
            ["static fraction", f"{memory['fraction']:g} = {memory['static_gb']:.1f} GB"],
            ["weights", f"{memory['parameters'] / 1e9:.2f} B parameters, {memory['dtype']}: "
                        f"{memory['weights_gb']:.1f} GB, {memory['weights_gb_per_chip']:.1f} GB per chip"],
            ["symmetric reservation", f"{memory['symmetric_gb_per_chip']:.1f} GB per chip"],
            ["KV cache", f"{memory['kv_gb_per_chip']:.2f} GB per chip ({memory['kv_dtype']}, "
                         f"{memory['max_total_tokens'] or 'no'} --max-total-tokens)"],
            ["left", f"{memory['left_gb_per_chip']:.1f} GB per chip"],
        ]  # fmt: skip
        out.append(table([f"MEMORY ({plural(memory['chips'], 'chip')})", "PER CHIP"], rows))
    elif serving.get("memory_note"):
        out.append(f"  {serving['memory_note']}")
    return out


def system_line(system: dict[str, Any] | None) -> str | None:
    """``System: driver 2.10.0, firmware 19.10.0.0 (4 devices), 1 GiB hugepages 16 (node 0:
    16), IOMMU identity``: what system pre-flight read (``ttmesh.check/1``'s ``system``)."""
    if not system or not system.get("devices"):
        return None
    bundles: dict[str, int] = {}
    for d in system["devices"]:
        v = d["firmware"].get("fw_bundle") or "unknown"
        bundles[v] = bundles.get(v, 0) + 1
    fw = ", ".join(f"{v} ({plural(n, 'device')})" for v, n in bundles.items())
    pages = system["hugepages"]
    count = "not known" if pages["total"] is None else str(pages["total"])
    if len(pages["nodes"]) > 1:
        count += " (" + ", ".join(f"node {k}: {v}" for k, v in pages["nodes"].items()) + ")"
    iommu = sorted({d["iommu"] or "none" for d in system["devices"]})
    return (
        f"System: driver {system['driver'] or 'unknown'}, firmware {fw}, 1 GiB hugepages "
        f"{count}, IOMMU {'/'.join(iommu)}"
    )


def check_text(report: Any, said: set[str] | frozenset[str] = frozenset()) -> str:
    """``check``'s text; ``said``: notes about the host this user was told already (not again)."""
    rows = []
    for c in report.chips:
        pids = ",".join(str(h.pid) for h in c.holders or [])
        held = "unknown" if c.holders is None else (pids or "-")
        rows.append(
            [
                c.bdf or "remote",
                c.asic_id,
                "-" if c.dev_index is None else c.dev_index,
                c.board_type or "-",
                c.heartbeat if c.present else "GONE",
                held,
                lease_cell(c.lease),
                "ok" if c.healthy else "PROBLEM",
            ]
        )
    out = [table(["CHIP", "ASIC", "DEV", "BOARD", "HEARTBEAT", "HELD BY", "LEASE", "STATE"], rows)]
    counts: dict[str, int] = {}
    for link in report.links:
        counts[link.state] = counts.get(link.state, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none expected"
    out.append(f"Ethernet links: {summary}")
    system = system_line(report.system)
    out += [system] if system else []
    out += [f"note: {n}" for n in report.notes if n not in said]
    errors = len(report.errors)
    warnings = len(report.problems) - errors
    if report.healthy:
        out.append("healthy" + (f" ({plural(warnings, 'warning')})" if warnings else ""))
    else:
        out.append(f"UNHEALTHY: {plural(errors, 'error')}, {plural(warnings, 'warning')}")
    out += problem_lines(report.problems)
    return "\n".join(out)


def reset_text(outcome: Any) -> str:
    n = len(outcome.attempts)
    rows = []
    for c in outcome.chips:
        dev = (
            f"{_dev(c['dev_before'])}->{_dev(c['dev_after'])}"
            if c["dev_before"] != c["dev_after"]
            else _dev(c["dev_after"])
        )
        rows.append(
            [
                c["bdf"] or f"remote {c['asic_id']}",
                c["asic_id"],
                c["before"],
                c["after"],
                dev,
                n,
            ]
        )
    out = [table(["CHIP", "ASIC", "BEFORE", "AFTER", "DEV", "ATTEMPTS"], rows)]
    if outcome.stopped:
        out.append(
            f"stopped holder {'pid' if len(outcome.stopped) == 1 else 'pids'}: "
            + ", ".join(map(str, outcome.stopped))
        )
    if outcome.recovered and outcome.missing:  # what is there is back; the host is not whole
        out.append(
            f"NOT RECOVERED: {plural(len(outcome.chips), 'chip')} reset and verified after "
            f"{plural(n, 'attempt')}, {outcome.seconds:.1f} s, but "
            f"{plural(len(outcome.missing), 'chip')} of the host "
            f"{'is' if len(outcome.missing) == 1 else 'are'} missing"
        )
    elif outcome.recovered:
        out.append(
            f"recovered and verified: {plural(len(outcome.chips), 'chip')} after "
            f"{plural(n, 'attempt')}, "
            f"{outcome.seconds:.1f} s"
        )
    else:
        out.append(f"NOT RECOVERED after {plural(n, 'attempt')}")
    out += problem_lines(outcome.problems)
    return "\n".join(out)


def _dev(value: int | None) -> str:
    return "-" if value is None else str(value)


def problem_lines(problems: list[Any]) -> list[str]:
    """Each problem once, with its fix under it; problems one fix cures are said together,
    the fix once under them (in the order each fix first comes)."""
    by_fix: dict[str, list[Any]] = {}
    for p in problems:
        by_fix.setdefault(p.fix, []).append(p)
    out = []
    for fix, group in by_fix.items():
        out += [f"{p.severity}: {p.what}" for p in group]
        out.append(f"  fix: {fix}")
    return out


TOP_HEADERS = ["DEV", "PCI", "BOARD", "TEMP", "POWER", "AICLK", "HEARTBEAT", "LINKS", "JOB"]


def top_rows(data: dict) -> list[list[str]]:
    """One row per chip of a ttmesh.top/1 document (the live view draws the same cells)."""
    bdf_of = {c["asic_id"]: c["bdf"] for c in data["chips"]}
    rows = []
    for c in data["chips"]:
        links = c["links"]
        linked = "-"
        if links["expected"]:
            linked = f"{links['up']}/{links['expected']} up"
            if links["down"]:
                linked += f", {links['down']} down"
        rows.append(
            [
                "-" if c["dev_index"] is None else str(c["dev_index"]),
                c["bdf"] or f"remote via {bdf_of.get(c['via']) or '?'}",
                c["board_type"],
                _unit(c["temperature_c"], "{:.1f} °C"),
                _unit(c["power_w"], "{:.1f} W"),
                _unit(c["aiclk_mhz"], "{:.0f} MHz"),
                c["heartbeat"]["state"],
                linked,
                _holder(c),
            ]
        )
    return rows


def _unit(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _holder(chip: dict) -> str:
    """The job leasing the chip, else who holds it."""
    if chip["lease"]:
        lease = chip["lease"]
        if lease["verified"]:
            return f"{lease['job']} (pid {lease['pid']}, {lease['user']})"
        return lease_cell(lease)
    if chip["holders"] is None:
        return "unknown"
    held = chip["holders"]
    if not held:
        return "-"
    first = held[0]
    who = first.get("job") or f"pid {first['pid']} ({first['cmd'][:40]})"
    return who + (f" +{len(held) - 1}" if len(held) > 1 else "")


def top_text(data: dict) -> str:
    """A ttmesh.top/1 document as a table, with its source and notes."""
    import time

    when = time.strftime("%H:%M:%S", time.localtime(data["time"]))
    out = [
        f"{when}  {plural(len(data['chips']), 'chip')}, telemetry from {data['source']}",
        table(TOP_HEADERS, top_rows(data)),
    ]
    out += [f"note: {n}" for n in data["notes"]]
    return "\n".join(out)


def fleet_text(data: dict) -> str:
    """``ttmesh launch --replicas N --dry-run``: the router, then each replica's chips, port,
    rewritten command and descriptor."""
    router = data["router"]
    lines = [
        f"fleet {data['job']}: {plural(len(data['replicas']), 'replica')} behind SGLang's router "
        f"at {router['url']}"
    ]
    if data.get("recovery"):
        lines.append(f"recovery: {data['recovery']}")
    if router.get("metrics"):
        lines.append(f"router metrics (Prometheus): {router['metrics']['url']}")
    if router.get("args"):
        lines.append(f"router options: {' '.join(router['args'])}")
    for r in data["replicas"]:
        chips = ",".join(r["chips"]) or "no Tenstorrent chip"
        lines.append(f"replica {r['replica']} (job {r['job']}): {chips}, at {r['url']}")
        lines.append(f"  command: {' '.join(r['argv'])}")
        for name, path in r["descriptors"].items():
            lines.append(f"  descriptor {name}: {path}")
    return "\n".join(lines)


def _clock(when: object, date: bool = False) -> str:
    """A Unix time as local time (``-`` when unknown)."""
    import time

    if not isinstance(when, (int, float)) or isinstance(when, bool) or when <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S", time.localtime(when))


def job_text(record: dict[str, Any]) -> str:
    """``ttmesh ps JOB``: one job's record, for the person who comes back to it: where and what
    it ran, how each attempt ended, the restarts and resets, the known failure and its fix,
    and where its output is (with the failing rank's last lines)."""
    from ttmesh.render import printable

    job = printable(str(record.get("job")))
    if record.get("ended"):
        code = record.get("code")
        head = f"job {job}: ended: {printable(str(record.get('status') or '?'))}"
        head += f" (exit {code})" if code is not None else ""
    elif record.get("stopped"):  # SIGSTOP, Ctrl-Z: as ps's own line says it
        held = ", ".join(f"{p['what']} {p['pid']}" for p in record["stopped"])
        pids = " ".join(str(p["pid"]) for p in record["stopped"])
        head = (
            f"job {job}: stopped ({held}: SIGSTOP or Ctrl-Z): nothing moves until kill -CONT {pids}"
        )
    else:
        head = f"job {job}: running (pid {record.get('pid')}, supervisor pid {record.get('guardian') or '-'})"
    out = [head]
    who = [f"host {printable(str(record.get('host') or '?'))}"]
    if record.get("user"):
        who.append(f"user {printable(str(record['user']))}")
    who.append(f"root {printable(str(record.get('root') or '-'))}")
    out.append("  " + ", ".join(who))
    times = f"  started {_clock(record.get('started'), date=True)}"
    if record.get("ended"):
        took = float(record["ended"]) - float(record.get("started") or record["ended"])
        times += f", ended {_clock(record['ended'])} ({took:.1f} s)"
    out.append(times)
    out.append(f"  command: {printable(' '.join(map(str, record.get('command') or [])))}")
    server = record.get("server") if isinstance(record.get("server"), dict) else None
    if record.get("profile") or server:
        line = f"  profile: {printable(str(record.get('profile') or '-'))}"
        if server:
            line += f"; server {printable(str(server.get('url')))}"
            if server.get("state") and not record.get("ended"):
                line += f" ({printable(str(server['state']))} since {_clock(server.get('since'))})"
        out.append(line)
    out += _ranks_lines(record)
    out += _history_lines(record)
    out += _diagnosis_lines(record.get("diagnosis"))
    out += _logs_lines(record)
    return "\n".join(out)


def _ranks_lines(record: dict[str, Any]) -> list[str]:
    from ttmesh.render import printable

    ranks = [r for r in record.get("ranks") or [] if isinstance(r, dict)]
    chips = [b for r in ranks for b in r.get("bdfs") or []]
    out = [f"  chips: {printable(', '.join(chips))}" if chips else "  chips: none"]
    if ranks:
        rows = [
            [r.get("rank"), r.get("pid") or "-", printable(",".join(r.get("bdfs") or [])) or "-",
             printable(",".join(r.get("chips") or [])) or "-"]
            for r in ranks
        ]  # fmt: skip
        out.append(table(["RANK", "PID", "PCI", "ASIC"], rows))
    return out


def _history_lines(record: dict[str, Any]) -> list[str]:
    """Attempts, restarts, resets and phases, each with its time."""
    from ttmesh.render import printable

    out: list[str] = []
    attempts = [a for a in record.get("attempts") or [] if isinstance(a, dict)]
    if attempts:
        out.append(f"{plural(len(attempts), 'attempt')}:")
        for a in attempts:
            out.append(
                f"  {int(a.get('attempt') or 0) + 1}: {_clock(a.get('started'))}-"
                f"{_clock(a.get('ended'))} exit {a.get('code')}: {printable(str(a.get('reason')))}"
            )
    for r in record.get("restarts") or []:
        if isinstance(r, dict):
            out.append(
                f"restart: attempt {int(r.get('attempt') or 0) + 1} at {_clock(r.get('at'))}, "
                f"after {printable(str(r.get('after')))}"
            )
    for r in record.get("resets") or []:
        if not isinstance(r, dict):
            continue
        if r.get("refused"):
            what = f"refused ({printable(str(r['refused']))})"
        else:
            verdict = "recovered and verified" if r.get("recovered") else "NOT recovered"
            what = f"{plural(len(r.get('chips') or []), 'chip')} {verdict} ({r.get('seconds')} s)"
        why = f" ({printable(str(r['why']))})" if r.get("why") else ""
        out.append(f"reset {r.get('when') or ''} at {_clock(r.get('at'))}: {what}{why}")
    for p in record.get("phases") or []:
        if isinstance(p, dict):
            out.append(f"phase {printable(str(p.get('phase')))} at {_clock(p.get('at'))}")
    return out


def _diagnosis_lines(diagnosis: object) -> list[str]:
    from ttmesh.render import printable

    if not isinstance(diagnosis, dict):
        return []
    return [
        f"known failure ({printable(str(diagnosis.get('id')))}): {printable(str(diagnosis.get('cause')))}",
        f"  seen: {printable(str(diagnosis.get('line')))}",
        f"  fix: {printable(str(diagnosis.get('fix')))}",
        f"  see {printable(str(diagnosis.get('link')))}",
    ]


def _logs_lines(record: dict[str, Any]) -> list[str]:
    """Where the output is kept, and the last lines of the rank that ended the job."""
    from ttmesh.render import printable
    from ttmesh.runtime import logread

    if not record.get("logs"):
        return ["logs: none kept (--no-logs)"] if record.get("layout") != "fleet" else []
    job = str(record.get("job"))
    out = [f"logs: {printable(str(record['logs']))} (ttmesh logs {job})"]
    tails = logread.tail_bytes(job, 4096)
    if not tails:
        return out
    last = max(int(k.split("/")[0].removeprefix("attempt_")) for k in tails)
    failing = next(
        (a.get("rank") for a in reversed(record.get("attempts") or []) if isinstance(a, dict)),
        None,
    )
    owner = str(failing) if isinstance(failing, int) else "0"
    for stream in ("stderr", "stdout"):
        data = tails.get(f"attempt_{last}/{owner}/{stream}")
        if data:
            lines = data.decode(errors="replace").rstrip("\n").split("\n")[-5:]
            out.append(f"  last lines of rank {owner}'s {stream} (attempt {last + 1}):")
            out += [f"    {printable(line)}" for line in lines]
            break
    return out
