"""Eval results, reports, run comparisons and plots: pure functions over records and files.

`seed eval` plays the tasks, then `commands.write_eval_outputs` writes results.json (`results.summarize_episodes`),
report.md (`markdown.render_report`) and success_by_type.png (`plots.plot_success_by_type`). Categories, metric
names and the paper's numbers come from the environment (`seedcli.envs`), named by results.json's `env`.
`seed report RUN...` compares eval runs (`commands.report_command`, the table in `compare`); `seed plot RUN...`
draws training curves from rl runs' metrics.jsonl (`commands.plot_command`).

No torch here. matplotlib is imported inside the plotting functions and draws with the Agg canvas (no display).
"""
