"""Draws a benchmark JSON (bench/bench_torch.py --json) as a PNG. Needs matplotlib
(pip install kvattn[plot]).

    python -m kvattn.plot bench.json -o bench.png      (or the kvattn-plot command)

Decode panel: % of the measured read-bandwidth ceiling per shape (batch x context), kvattn
beside PyTorch SDPA (flash, cuDNN) on the same device. Prefill panel (when the JSON has a
"prefill" section): TFLOP/s per shape, kvattn beside PyTorch.
"""
import argparse
import json
import sys


def _decode_series(data):
    rows = data.get("rows") or []
    ceil = data.get("ceiling_gbs")
    labels, series = [], {"kvattn": [], "torch flash": [], "torch cuDNN": []}
    for r in rows:
        if "ours_gbs" not in r or not ceil:
            continue
        labels.append("%dx%d" % (r["batch"], r["ctx"]))
        series["kvattn"].append(100.0 * r["ours_gbs"] / ceil)
        series["torch flash"].append(100.0 * r["flash_gbs"] / ceil if r.get("flash_gbs") else None)
        series["torch cuDNN"].append(100.0 * r["cudnn_gbs"] / ceil if r.get("cudnn_gbs") else None)
    return labels, series


def _prefill_series(data):
    rows = (data.get("prefill") or {}).get("rows") or []
    labels, series = [], {"kvattn": [], "torch flash": [], "torch cuDNN": []}
    for r in rows:
        if r.get("ours_tflops") is None:
            continue
        seq = r.get("seq", r.get("ctx", "?"))
        label = "%s %sx%s d%s%s" % (r.get("dtype", ""), r.get("batch", "?"), seq, r.get("d", ""),
                                    " causal" if r.get("causal") else "")
        if r.get("kind") and r["kind"] != "equal":
            label += " " + r["kind"]
        labels.append(label.strip())
        series["kvattn"].append(r["ours_tflops"])
        series["torch flash"].append(r.get("flash_tflops"))
        series["torch cuDNN"].append(r.get("cudnn_tflops"))
    return labels, series


def _bars(ax, labels, series, ylabel, title):
    series = {k: v for k, v in series.items() if any(x is not None for x in v)}
    n = len(series)
    width = 0.8 / n
    colors = {"kvattn": "#1f6feb", "torch flash": "#999999", "torch cuDNN": "#555555"}
    for i, (name, vals) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        ys = [v if v is not None else 0.0 for v in vals]
        ax.bar(xs, ys, width, label=name, color=colors.get(name))
    ax.set_xticks(range(len(labels)))
    many = len(labels) > 16  # (the prefill table's 42 rows: steeper, smaller labels)
    ax.set_xticklabels(labels, rotation=60 if many else 35, ha="right", fontsize=7 if many else 8,
                       rotation_mode="anchor")
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def plot(data, out_png):
    """Writes out_png from a benchmark dict; returns the number of panels drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    d_labels, d_series = _decode_series(data)
    if d_labels:
        panels.append(("decode", d_labels, d_series))
    p_labels, p_series = _prefill_series(data)
    if p_labels:
        panels.append(("prefill", p_labels, p_series))
    if not panels:
        raise ValueError("no decode rows (rows[].ours_gbs + ceiling_gbs) or prefill rows "
                         "(prefill.rows[].ours_tflops) in the benchmark data")
    # side by side while every panel is short; one above the other, as wide as the longest needs
    # (~0.3 inch a row), when one holds many rows
    longest = max(len(p[1]) for p in panels)
    if longest > 16:
        fig, axes = plt.subplots(len(panels), 1, figsize=(max(6.5, 0.3 * longest), 4.6 * len(panels)),
                                 squeeze=False)
        axes = [a[0] for a in axes]
    else:
        fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
        axes = axes[0]
    dev = data.get("device", "?")
    for ax, (kind, labels, series) in zip(axes, panels):
        if kind == "decode":
            _bars(ax, labels, series, "% of read ceiling",
                  "paged decode, %s (ceiling %.0f GB/s)" % (dev, data.get("ceiling_gbs", 0)))
            ax.set_ylim(0, 105)
        else:
            _bars(ax, labels, series, "TFLOP/s", "prefill, %s" % dev)
    if data.get("date"):
        fig.text(0.995, 0.995, data["date"], ha="right", va="top", fontsize=7, color="#666666")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return len(panels)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kvattn-plot", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="benchmark JSON (bench_torch.py --json)")
    ap.add_argument("-o", "--output", default=None, help="PNG to write (default: JSON name with .png)")
    args = ap.parse_args(argv)
    out = args.output or (args.json.rsplit(".", 1)[0] + ".png")
    with open(args.json) as f:
        data = json.load(f)
    n = plot(data, out)
    print("wrote %s (%d panel%s)" % (out, n, "" if n == 1 else "s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
