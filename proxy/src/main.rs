//! The `tenant-proxy` binary: parses arguments, loads configuration, binds,
//! and hands over to the library. Also the operator helpers.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tenant_proxy::auth::password;
use tenant_proxy::cli::{self, Subject};
use tenant_proxy::config::Config;
use tenant_proxy::Proxy;

#[derive(Parser)]
#[command(
    version,
    about = "Multi-tenant authenticating gateway for Loki and Prometheus"
)]
struct Cli {
    /// The proxy's configuration file (YAML).
    #[arg(long, env = "TENANT_PROXY_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Log format: `text` or `json`.
    #[arg(
        long,
        env = "TENANT_PROXY_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default).
    Run,
    /// Read a password on stdin and print its argon2id PHC hash.
    HashPassword,
    /// Validate the configuration and tenants file, print a summary.
    CheckConfig,
    /// Print a PromQL query as label mode enforces it for a user or tenant.
    Rewrite {
        /// The user whose tenant the query runs for.
        #[arg(long, required_unless_present = "tenant", conflicts_with = "tenant")]
        user: Option<String>,
        /// The tenant id the query runs for.
        #[arg(long)]
        tenant: Option<String>,
        /// Treat the input as a `match[]` series selector.
        #[arg(long)]
        selector: bool,
        query: String,
    },
}

/// A musl build (the container image) allocates with mimalloc: musl's own
/// allocator cost 11-37 % more CPU on remote write (docs/benchmarks.md).
/// Its arenas are committed on demand, set in `.cargo/config.toml`.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tenant_proxy::ops::process::init_logging(&cli.log_format).map_err(anyhow::Error::msg)?;
    match cli.command.unwrap_or(Command::Run) {
        Command::HashPassword => hash_password(),
        Command::CheckConfig => print(cli::check_config(&load_config(cli.config)?)),
        Command::Rewrite {
            user,
            tenant,
            selector,
            query,
        } => {
            let subject = match (user, tenant) {
                (Some(user), _) => Subject::User(user),
                (None, Some(tenant)) => Subject::Tenant(tenant),
                (None, None) => anyhow::bail!("pass --user or --tenant"),
            };
            let config = load_config(cli.config)?;
            print(cli::rewrite(&config, &subject, &query, selector))
        }
        Command::Run => run(load_config(cli.config)?),
    }
}

fn print(text: cli::CliResult) -> anyhow::Result<()> {
    let text = text.map_err(|e| anyhow::anyhow!(e))?;
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

fn load_config(path: Option<PathBuf>) -> anyhow::Result<Config> {
    let path = path.context("no configuration: pass --config FILE or set TENANT_PROXY_CONFIG")?;
    Ok(Config::load(&path)?)
}

fn hash_password() -> anyhow::Result<()> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let password = line.trim_end_matches(['\r', '\n']);
    anyhow::ensure!(!password.is_empty(), "empty password on stdin");
    let hash = password::hash_password(password).map_err(anyhow::Error::msg)?;
    writeln!(std::io::stdout(), "{hash}")?;
    Ok(())
}

#[tokio::main]
async fn run(config: Config) -> anyhow::Result<()> {
    tenant_proxy::ops::open_files::raise_for(config.limits.max_connections);
    let listener = tenant_proxy::http::server::bind(config.listen, &config.limits)
        .with_context(|| format!("binding {}", config.listen))?;
    let admin = tokio::net::TcpListener::bind(config.admin_listen)
        .await
        .with_context(|| format!("binding {}", config.admin_listen))?;
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let proxy = Proxy::new(config)?;
    let hangups = tenant_proxy::ops::process::recheck_on_hangup(
        proxy.recheck_files(),
        "re-reading the tenants file and the TLS files",
    )
    .context("installing a SIGHUP handler")?;
    tokio::spawn(hangups);
    let shutdown = tenant_proxy::ops::process::shutdown_signal()
        .context("installing the SIGTERM and SIGINT handlers")?;
    tracing::info!(listen = %listener.local_addr()?, admin = %admin.local_addr()?, "tenant-proxy serving");
    // Served on one of the runtime's workers, not on this thread (which
    // `block_on` keeps outside them): an accepted connection's task then
    // starts on the worker that accepted it. Served from here, each
    // connection meant waking this thread to accept it and then a worker
    // to serve it (docs/benchmarks.md).
    tokio::spawn(proxy.serve(listener, admin, shutdown))
        .await
        .context("serving")?;
    tracing::info!("tenant-proxy stopped");
    Ok(())
}
