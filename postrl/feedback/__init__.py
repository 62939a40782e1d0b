"""The preference loop (`postrl loop`, `postrl.loop`; a package apart from the stages because it drives them as
a user's script does, through `postrl.api`): rounds of sampling pairs from the current policy, labelling them
(people, a judge, or the synthetic labeller), reward learning on every label so far, and a policy update
(`rounds.py`). Nothing is imported here, so the command's ``--help`` stays free of torch."""
