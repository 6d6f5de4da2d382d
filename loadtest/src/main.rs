//! `loadtest run`: each scenario direct to the sink, then through a
//! `tenant-proxy` process, back to back; a Markdown table on stdout and,
//! optionally, JSON.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use loadtest::load::{self, Workload};
use loadtest::proxy_process::{self, ProxyProcess};
use loadtest::report::{self, Row};
use loadtest::scenario::Scenario;
use loadtest::{bodies, sink};

#[derive(Parser)]
#[command(about = "Measure tenant-proxy against a sink, direct vs proxied, on loopback only")]
struct Cli {
    /// Scenario files (loadtest/scenarios/*.yaml).
    #[arg(required = true)]
    scenarios: Vec<PathBuf>,
    /// The tenant-proxy binary (default: next to this one).
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
    /// Write the rows as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the proxy's per-request access log on (the default config).
    #[arg(long)]
    access_log: bool,
    /// Override every scenario's measured duration (e.g. `3s` for a smoke run).
    #[arg(long, value_parser = humantime_serde::re::humantime::parse_duration)]
    duration: Option<std::time::Duration>,
}

type ProxyOptions<'a> = (
    &'a std::path::Path,
    std::net::SocketAddr,
    &'a str,
    bool,
    bool,
);

/// One measured run through a fresh proxy process; with `guessing`, the
/// scenario's password guessers run alongside (their answers in the row's
/// `guess_statuses`).
async fn proxied(
    scenario: &Scenario,
    workload: &Arc<Workload>,
    sink_stats: &sink::SinkStats,
    (binary, sink_addr, tenants, access_log, throttle): ProxyOptions<'_>,
    guessing: bool,
) -> anyhow::Result<Row> {
    let proxy = ProxyProcess::start(binary, sink_addr, tenants, access_log, throttle).await?;
    let idle = proxy_process::stats(proxy.pid())?;
    let pid = proxy.pid();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let guessers = match (&scenario.guessing, guessing) {
        (Some(g), true) => {
            let (g, stop, path, addr) = (
                g.clone(),
                stop.clone(),
                scenario.requests[0].path.clone(),
                proxy.addr,
            );
            let max = g.rate * (scenario.warmup + scenario.duration).as_secs().max(1) * 2;
            Some(tokio::spawn(async move {
                load::guess(addr, &g, &path, stop, max).await
            }))
        }
        _ => None,
    };
    let mut cpu = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    let mut connections = (0, 0);
    let outcome = load::run(proxy.addr, scenario, workload.clone(), |starting| {
        let now = proxy_process::stats(pid).map(|s| s.cpu).unwrap_or_default();
        if starting {
            cpu.0 = now;
            connections.0 = sink_stats.connections();
        } else {
            cpu.1 = now;
            connections.1 = sink_stats.connections();
        }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let guess_statuses = match guessers {
        Some(task) => Some(task.await?),
        None => None,
    };
    let peak = proxy_process::stats(pid)?;
    let target = if guessing { "proxy+guessing" } else { "proxy" };
    let mut row = Row::new(
        &scenario.name,
        target,
        &outcome,
        connections.1 - connections.0,
    );
    row.proxy_cpu_us_per_request =
        Some((cpu.1 - cpu.0).as_secs_f64() * 1e6 / outcome.requests().max(1) as f64);
    row.proxy_idle_rss_mib = Some(idle.rss_kib as f64 / 1024.0);
    row.proxy_peak_rss_mib = Some(peak.peak_rss_kib as f64 / 1024.0);
    row.guess_statuses = guess_statuses;
    Ok(row)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let binary = cli.proxy_bin.unwrap_or_else(proxy_process::default_binary);
    let (sink_addr, sink_stats) = sink::start().await?;
    let mut rows = Vec::new();
    for path in &cli.scenarios {
        let mut scenario = Scenario::load(path)?;
        if let Some(duration) = cli.duration {
            scenario.duration = duration;
            scenario.warmup = scenario.warmup.min(duration / 2);
        }
        eprintln!("== {}: {}", scenario.name, scenario.description);
        let prepared = scenario
            .requests
            .iter()
            .map(|r| bodies::prepare(&r.method, &r.path, &r.body))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let workload = Arc::new(Workload::new(&scenario, prepared));

        let before = sink_stats.connections();
        let direct = load::run(sink_addr, &scenario, workload.clone(), |_| {}).await;
        rows.push(Row::new(
            &scenario.name,
            "direct",
            &direct,
            sink_stats.connections() - before,
        ));

        let tenants = proxy_process::tenants_file(scenario.users);
        let throttle = scenario.guessing.is_some();
        let options = (
            binary.as_path(),
            sink_addr,
            tenants.as_str(),
            cli.access_log,
            throttle,
        );
        rows.push(proxied(&scenario, &workload, &sink_stats, options, false).await?);
        if scenario.guessing.is_some() {
            rows.push(proxied(&scenario, &workload, &sink_stats, options, true).await?);
        }
    }
    print!("{}", report::table(&rows));
    if let Some(path) = cli.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
