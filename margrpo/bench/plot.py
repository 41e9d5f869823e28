"""A PNG of a size sweep: speedup over eager against the number of tokens, one panel per op and
mode, one line per implementation, bars from the paired ratios' p20 to p80 (needs matplotlib:
`pip install margrpo[plot]`).

    python -m margrpo.bench.plot results.json out.png   # re-plot a `margrpo bench ops --json` file
"""

from __future__ import annotations

import json
import sys


def speedup_plot(rows: list[dict], path: str, title: str = "") -> None:
    """rows: `margrpo.bench.ops.Row`s as dicts (op, mode, tokens, impl, speedup, speedup_p20, speedup_p80)."""
    if not rows:
        raise ValueError("rows: got none, expected the rows of a benchmark run to plot")
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    except ImportError as err:
        raise RuntimeError(f"--plot needs matplotlib ({err}); install it with `pip install margrpo[plot]`") from None
    panels = list(dict.fromkeys((r["op"], r["mode"]) for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    colours = {impl: f"C{i % 10}" for i, impl in enumerate(impls)}  # one colour per impl in every panel
    columns = min(3, len(panels))
    lines = -(-len(panels) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.6 * lines), squeeze=False)
    for ax, (op, mode) in zip(axes.flat, panels):
        panel = [r for r in rows if (r["op"], r["mode"]) == (op, mode)]
        for impl in dict.fromkeys(r["impl"] for r in panel):
            points = sorted((r["tokens"], r["speedup"], r["speedup_p20"], r["speedup_p80"]) for r in panel if r["impl"] == impl)
            x, y, low, high = (list(v) for v in zip(*points))
            ax.errorbar(
                x,
                y,
                yerr=[[a - b for a, b in zip(y, low)], [b - a for a, b in zip(y, high)]],
                marker="o",
                capsize=3,
                label=impl,
                color=colours[impl],
                linestyle="--" if impl == "eager" else "-",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # 0.5, 1, 2, 5, 10, ...
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{op} ({mode})", fontsize=10)
        ax.set_xlabel("tokens")
        ax.set_ylabel("speedup vs eager (x)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        print("usage: python -m margrpo.bench.plot RESULTS.json OUT.png", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        data = json.load(f)
    machine = data.get("machine", {})
    speedup_plot(data["rows"], argv[1], title=f"{machine.get('gpu') or machine.get('cpu', '')}, load {machine.get('load_average')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
