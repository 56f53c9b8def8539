"""gridctl model evaluate MODEL --workload W (--passed N --total M | --score S): record quality.

Posts the owner's evaluation to the admin API (POST /allocator/evaluations) with the operator
token; the controller appends it and the portfolio's quality confidence for (model, workload,
configured revision) moves. --artifact-sha256 makes the controller refuse (409) if the model's
configured weights are no longer the ones that were evaluated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from grid.cli.admin import AdminOption, TokenFileOption, admin_url, operator_token, request
from grid.cli.common import JsonOption, console, fail, print_json
from grid.events.requests import WORKLOADS


def evaluate(
    model_id: str = typer.Argument(..., help="Configured model id to record the evaluation for."),
    workload: str = typer.Option(..., "--workload", help=f"Workload evaluated: one of {', '.join(WORKLOADS)}."),
    passed: Optional[int] = typer.Option(None, "--passed", min=0, help="Evaluations passed (with --total)."),
    total: Optional[int] = typer.Option(None, "--total", min=1, help="Evaluations run (with --passed)."),
    score: Optional[float] = typer.Option(None, "--score", help="Score in [0, 1], instead of --passed/--total."),
    latency_ms: Optional[float] = typer.Option(None, "--latency-ms", min=0.0,
                                               help="Typical latency observed during the evaluation, ms."),
    artifact_sha256: Optional[str] = typer.Option(
        None, "--artifact-sha256",
        help="Digest of the weights evaluated; refused unless it is the model's configured revision."),
    json_out: bool = JsonOption,
    admin: Optional[str] = AdminOption,
    token_file: Optional[Path] = TokenFileOption,
) -> None:
    """Record an owner's quality evaluation of MODEL on a workload (operator token)."""
    if (passed is None) != (total is None):
        fail("--passed and --total go together")
    if passed is None and score is None:
        fail("give --passed N --total M, or --score S")
    if passed is not None and score is not None:
        fail("give either --passed/--total or --score, not both")
    body: dict[str, Any] = {"model_id": model_id, "workload": workload}
    for key, value in (("passed", passed), ("total", total), ("score", score), ("latency_ms", latency_ms),
                       ("artifact_sha256", artifact_sha256)):
        if value is not None:
            body[key] = value
    data = request("POST", admin_url(admin), "/allocator/evaluations", token=operator_token(token_file), body=body)
    if json_out:
        print_json(data)
        return
    sha = data.get("artifact_sha256")
    console.print(f"recorded {data['model_id']} on {data['workload']}: score {data['score']:.3f} over "
                  f"{data['samples']} evaluation(s)" + (f" (revision {sha[:12]}...)" if sha else "")
                  + f", seq {data['seq']}")


def register(model_app: typer.Typer) -> None:
    model_app.command("evaluate")(evaluate)
