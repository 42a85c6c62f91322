"""CLI commands of the resource layer: ``loopd manifests crds`` and ``loopd kubeconfig``.

Wired into the main app by ``loopd.cli._app``: ``app.add_typer(manifests_app, name="manifests")`` and
``app.command("kubeconfig")(kubeconfig_command)``.
"""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from loopd._paths import default_data_dir
from loopd.resources import builtin_crds, load_or_create_credentials, read_endpoint, render_kubeconfig

manifests_app = typer.Typer(name="manifests", help="Print deployment manifests.", no_args_is_help=True)


def render_crds() -> str:
    """Every CRD loopd ships, as one multi-document YAML stream."""
    return yaml.safe_dump_all(builtin_crds(), sort_keys=False, explicit_start=True)


@manifests_app.command("crds")
def crds_command() -> None:
    """Print the CustomResourceDefinitions of loopd's kinds (apiextensions.k8s.io/v1)."""
    typer.echo(render_crds(), nl=False)


def kubeconfig_command(
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="The data directory of the running loopd (default: $LOOPD_DATA_DIR, else ~/.local/share/loopd).",
    ),
    server: str | None = typer.Option(
        None, "--server", help="API URL (default: the endpoint the running loopd recorded in its data directory)."
    ),
    namespace: str = typer.Option("default", "--namespace", "-n", help="Default namespace of the context."),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="LOOPD_TOKEN",
        help="The bearer token to put in it (default: the data directory's admin token). A responder's token from "
        "`loopd token create operator:<key>` gives a kubeconfig with only that responder's rights: read, leases, "
        "and the status of Tasks addressed to it.",
    ),
) -> None:
    """Print a kubeconfig (server URL, CA, bearer token) for loopd's Kubernetes-compatible API."""
    data_dir = data_dir or default_data_dir()
    url = server or read_endpoint(data_dir)
    if not url:
        typer.echo(f"no running loopd API recorded in {data_dir}; start `loopd up` or pass --server", err=True)
        raise typer.Exit(code=1)
    credentials = load_or_create_credentials(data_dir)
    bearer = token.strip() if token and token.strip() else credentials.token
    typer.echo(render_kubeconfig(url, credentials.ca_pem, bearer, namespace=namespace), nl=False)
