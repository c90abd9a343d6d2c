"""A real `fp8lab sweep` evaluating two lm-eval tasks of different output types (multiple choice
and generate_until, YAMLs and data written here): both tasks' metrics, lm-eval's results and the
per-item samples reach the trial's MLflow run, and eval/accuracy is their chosen aggregate.
The generative task's primary metric is overridden to its flexible filter, which scores 0 where
the strict one scores 1 (see eval_task_files): the mean then tells the override was honoured."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import EAGER_CASTS, TINY, client_for, read_json, run_cli
from tests.unit.workloads.eval.eval_task_files import GEN, MC, write_tasks

pytestmark = pytest.mark.integration


def test_sweep_with_a_multiple_choice_and_a_generative_task(workdir: Path) -> None:
    tasks = write_tasks(workdir / "eval", n=6)
    run_cli(["sweep", *TINY, "sweep.report=false", "cluster.num_cpus=1", "sweep.name=t-tasks",
             "sweep.axes.precision=[fp8_protected]", "sweep.axes.seed=[0]",
             f"eval.tasks=[{MC},{GEN}]", f"eval.include_path={tasks}",
             f"eval.metrics={{{GEN}: exact_match.flexible-extract}}"], workdir, env=EAGER_CASTS)
    client = client_for(workdir)
    runs = client.search_runs([client.get_experiment_by_name("t-tasks").experiment_id],
                              filter_string="tags.`fp8lab.role` = 'trial'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED", run.data.tags.get("fp8lab.reason")
    metrics = run.data.metrics
    for key in (f"eval/{MC}/acc", f"eval/{MC}/acc_stderr", f"eval/{MC}/acc_norm", f"eval/{GEN}/exact_match.strict-match",
                f"eval/{GEN}/exact_match.strict-match_stderr", f"eval/{GEN}/exact_match.flexible-extract"):
        assert key in metrics, (key, sorted(metrics))
    primaries = metrics[f"eval/{MC}/acc"], metrics[f"eval/{GEN}/exact_match.flexible-extract"]
    assert metrics["eval/accuracy"] == pytest.approx(sum(primaries) / 2)  # eval.primary=mean (default)
    assert metrics[f"eval/{GEN}/exact_match.strict-match"] != primaries[1]
    assert metrics["eval/n"] == 12
    assert json.loads(run.data.tags["fp8lab.eval_primary"]) == {MC: "acc", GEN: "exact_match.flexible-extract"}
    assert run.data.tags["fp8lab.eval_aggregate"] == "mean"

    folder = Path(client.download_artifacts(run.info.run_id, "eval", dst_path=str(workdir / "artifacts")))
    for task, label, value in ((MC, "acc", primaries[0]), (GEN, "exact_match.flexible-extract", primaries[1])):
        rows = [json.loads(line) for line in (folder / "samples" / f"{task}.jsonl").read_text().splitlines()]
        assert [r["doc_id"] for r in rows] == list(range(6)) and {r["metric"] for r in rows} == {label}
        assert sum(r["value"] for r in rows) / 6 == pytest.approx(value)
    assert set(read_json(folder / "results.json")["results"]) == {MC, GEN}
