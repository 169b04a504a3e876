"""What every plot of bench and load shares: how a figure is finished before it is saved."""

from __future__ import annotations

import textwrap


def finish_figure(fig, axes, title: str) -> None:
    """Every panel with a grid, a legend and its y axis from 0 (rates, times and counts); the
    title whole, wrapped to the figure's width."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    fig.suptitle(textwrap.fill(title, width=int(fig.get_figwidth() * 16)), fontsize=8)
    fig.tight_layout()
