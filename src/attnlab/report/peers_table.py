"""Markdown tables of a peers sweep's records (results/gpu-*-peers*/results.jsonl): TFLOP/s, GB/s, % of peak.

Pure Python, no JAX. One clock per table: every number is CUPTI kernel time unless marked † (another
timer, named in the footnote). A cell that failed its check shows its status and, below the table, its
reason. Under each table: how much of the output and which gradients the records say were checked.
benchmarks/peers/table.py is the command line.
"""

MARK = "†"


def _cell(r, metric):
    if r is None:
        return ""
    if r["status"] != "ok":
        return f"**{r['status']}**"
    return metric(r) + ("" if r.get("timer") == "cupti" else MARK)


def table(recs, sweep, metric, keyf, title, also=()):
    """One row per config of ``sweep``; ``also``: backends whose identical cells a resumed sweep
    took from an earlier part (the engine measures a cell once per results file)."""
    rs = [r for r in recs if r.get("sweep") == sweep]
    if not rs:
        return ""
    ident = {(keyf(r), r["dtype"], r["mode"]) for r in rs}
    own = list(dict.fromkeys(r["backend"] for r in rs))
    taken = [r for r in recs if r.get("sweep") != sweep and r["backend"] in also and r["backend"] not in own
             and (keyf(r), r["dtype"], r["mode"]) in ident]
    bes = [b for b in also if any(r["backend"] == b for r in taken)] + own
    rs = rs + taken
    keys = list(dict.fromkeys(keyf(r) for r in rs))
    out = [f"**{title}**", "", "| config | " + " | ".join(bes) + " |", "| --- |" + " --- |" * len(bes)]
    for k in keys:
        cells = [_cell(next((x for x in rs if keyf(x) == k and x["backend"] == b), None), metric) for b in bes]
        out.append(f"| {k} | " + " | ".join(cells) + " |")
    out.append("")
    out.extend(footnotes(rs, keyf))
    return "\n".join(out) + "\n"


def footnotes(rs, keyf):
    """The clocks other than CUPTI, the failing cells with their reasons, and what was checked."""
    notes = []
    other = sorted({r.get("timer") for r in rs if r["status"] == "ok" and r.get("timer") != "cupti"}, key=str)
    if other:
        notes.append(f"{MARK} not CUPTI kernel time: timed by {', '.join(map(str, other))} "
                     f"({'; '.join(sorted({r.get('timer_note', '') for r in rs if r.get('timer') in other} - {''}))}).")
    for r in rs:
        if r["status"] not in ("ok", "unsupported"):
            notes.append(f"- {r['backend']} {keyf(r)}: **{r['status']}**: {r['reason']}")
    ok = [r for r in rs if r["status"] == "ok"]
    if ok:
        whole = sum(r.get("checked_fraction") == 1.0 for r in ok)
        grads = [r for r in ok if r["mode"] != "fwd"]
        gok = sum(r.get("grad_checked_fraction") == 1.0 and r.get("grad_check") == "ok" for r in grads)
        margins = [r["margin"] for r in ok if r.get("margin") is not None]
        line = f"Checked: whole output on {whole} of {len(ok)} ok cells"
        if grads:
            line += f"; dq, dk, dv whole on {gok} of {len(grads)} backward cells"
        if margins:
            line += f"; smallest margin to the tolerance {min(margins):.2f}x"
        notes.append(line + ".")
    return notes


def _num(v, spec: str, unit: str = "") -> str:
    """``v`` formatted with ``spec`` and ``unit``, or "–" when the record lacks it (no peak known, no kernel time:
    a CPU or wall-clock record)."""
    return "–" if v is None else f"{v:{spec}}{unit}"


def tflops_cell(r) -> str:
    """'TFLOP/s (% of peak)' of an ok record ("–" for a number the record lacks)."""
    return f"{_num(r.get('tflops'), '.0f')} ({_num(r.get('pct_peak'), '.0f', '%')})"


def gbps_cell(r) -> str:
    """'GB/s (kernel ms)' of an ok decode record ("–" for a number the record lacks)."""
    return f"{_num(r.get('gbps'), '.0f', ' GB/s')} ({_num(r.get('kernel_ms'), '.3f', ' ms')})"


def fp8_cell(r) -> str:
    """Kernel ms, TFLOP/s (% of the peak of the dtype it computes in), rel L2 and, if known, FP8 in program."""
    facts = r.get("facts") or {}
    note = "" if "fp8_in_program" not in facts else f", FP8 in program: {'yes' if facts['fp8_in_program'] else 'no'}"
    err = None if r.get("rel_err") is None else 100 * r["rel_err"]
    return f"{_num(r.get('kernel_ms'), '.3f', ' ms')}, {_num(r.get('tflops'), '.0f', ' TF/s')} " \
           f"({_num(r.get('pct_peak'), '.0f', '%')} of {r.get('peak_dtype', '?')}), err {_num(err, '.2f', '%')}{note}"


def shape_label(r) -> str:
    """'H128 T1024 B1 causal'."""
    return f"H{r['head_dim']} T{r['q_len']} B{r['batch']}{' causal' if r['causal'] else ''}"


def tables(recs) -> list[str]:
    """The five tables of the peers results (fwd, fwd16, train, decode, fp8), each as Markdown ('' if absent)."""
    return [
        table(recs, "fwd", tflops_cell, shape_label, "Forward bf16, N=16, 16k tokens: TFLOP/s (% of 989 TFLOP/s)"),
        table(recs, "fwd16", tflops_cell, shape_label,
              "Forward fp16 (Pallas Mosaic GPU takes float16 only), 16k tokens: TFLOP/s (% of peak)"),
        table(recs, "train", tflops_cell, shape_label, "fwd+bwd bf16, T=4096, B=4, N=16, H=128: TFLOP/s (% of peak)"),
        table(recs, "decode", gbps_cell, lambda r: f"S{r['kv_len']}",
              "Decode T=1, B=8, N=32, K=8, H=128: GB/s (HBM 4800 GB/s)"),
        table(recs, "fp8", fp8_cell, shape_label, "FP8 vs bf16, N=16, H=128, 16k tokens: kernel ms, TFLOP/s (% of the "
              "peak of the dtype it computes in) and rel L2 of the whole output", also=("cudnn", "te")),
    ]
