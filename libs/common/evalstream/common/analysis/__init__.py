"""The read side: what the pipeline's results say, for the CLI, the aggregator's pages and
the benchmarks alike.

    queries.py       every read of item_results and runs (the one place with their SELECTs)
    reports.py       a run's summary (accuracy, latency, lm-eval's scores)
    items.py         a run's items a page at a time; two runs side by side
    paired.py        paired statistics (McNemar, bootstrap) and the comparison of two runs
    questions.py     "the same question" and "the same answer" (question_key, normalise)
    reliability.py   the label audit's estimator (Dawid-Skene EM, pure)
    audit.py         the label audit's checks (pure); audit_runs.py reads what they need
    versions.py      dataset versions: naming one, diffing two
    pages.py         what every HTML page shares (the escaper, head, Content-Security-Policy)
    charts.py        the report's server-drawn SVG charts
    report_html.py, items_html.py, compare_html.py   the pages

Importing the package imports none of them: the producer reads questions.py alone.
"""
