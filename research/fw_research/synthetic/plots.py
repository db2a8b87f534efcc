"""Figures in the style of the paper's Figure 2 (capacity) and Figure 3 (learning curves).

`cells` are result dicts as written by fw_research.synthetic.synthetic_retrieval: model, S, best_eval_loss,
curve [[step, eval_loss], ...], ...
"""
from fw_research.experiments.reports import plt


def _by_model(cells, order):
    """{model: [cell, ...] sorted by S}, models in `order` first, then any others by name."""
    groups = {}
    for cell in cells:
        groups.setdefault(cell["model"], []).append(cell)
    names = [m for m in order if m in groups] + sorted(set(groups) - set(order))
    return {m: sorted(groups[m], key=lambda c: c["S"]) for m in names}


def plot_capacity(cells, path, title, order=(), capacities=None):
    """Best eval loss against the number of unique keys S, one line per model, log-y (Figure 2).

    capacities: optional {model: d_dot}, drawn as dotted vertical lines in the model's colour.
    """
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, group in _by_model(cells, order).items():
        # a loss of exactly 0 cannot be drawn on a log axis; floor it far below the 1e-3 target
        losses = [max(c["best_eval_loss"], 1e-7) for c in group]
        (line,) = ax.plot([c["S"] for c in group], losses, marker="o", ms=4, label=name)
        if capacities and capacities.get(name):
            ax.axvline(capacities[name], color=line.get_color(), ls=":", lw=1)
    ax.axhline(1e-3, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("number of unique keys S (= sequence length L)")
    ax.set_ylabel("best eval loss")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_learning_curves(cells, path, title, order=()):
    """Eval loss against training step, one line per model (Figure 3), log-y."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, group in _by_model(cells, order).items():
        for cell in group:
            steps, losses = zip(*cell["curve"]) if cell["curve"] else ((), ())
            ax.plot(steps, losses, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("eval loss")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
