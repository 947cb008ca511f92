"""Build the operator's kubernetes-asyncio ApiClient (for ``tessera.kube.objects``) from a
kubeconfig or the in-cluster service account.
Not for: the node agent, whose calls go through ``tessera.kube.http`` so that it never loads
kubernetes-asyncio's models.
"""

from __future__ import annotations

import os

from kubernetes_asyncio import client, config


async def make_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient for ``kubeconfig``, else ``$KUBECONFIG``, else the in-cluster account."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = client.Configuration()
    if path:
        await config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration=configuration)
