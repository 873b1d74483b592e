"""What a trial is asked to do: the job, its settings request, the policy, the checks, the replies.

Below ``measuring/`` (which runs a job) and ``results/`` (which records it), so both, and the
launcher, name a job without importing each other: ``job`` (``JobSpec``: one checked job, its
keys), ``request`` (``SettingsRequest``), ``policy`` (``Policy`` and its file), ``checks`` (the
checks a job is made through, once), ``replies`` (what a worker answers the driver).
"""
