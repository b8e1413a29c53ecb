"""Acknowledged actions carried out through a site's scheduler: Slurm (``slurm.py``) or Kubernetes
(``kubernetes.py``), behind one interface (``backend.py``) and one registry (``registry.py``)."""
