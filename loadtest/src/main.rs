//! `loadtest run`: each scenario direct to the sink, then through a
//! `tenant-proxy` process, back to back; a Markdown table on stdout and,
//! optionally, JSON.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use loadtest::faults::{Fault, FaultyUpstream};
use loadtest::load::{self, Workload};
use loadtest::nginx::NginxProcess;
use loadtest::proxy_process::{self, Logging, ProcessStats, ProxyProcess};
use loadtest::report::{self, Reloads, Row, Silent};
use loadtest::scenario::{Faults, GlobalLimits, Reference, Scenario, Transport};
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
    /// The proxy's log format: `text` or `json` (the manifests' setting).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Override every scenario's measured duration (e.g. `3s` for a smoke run).
    #[arg(long, value_parser = humantime_serde::re::humantime::parse_duration)]
    duration: Option<Duration>,
    /// A real backend (a loopback address, e.g. a local Prometheus on
    /// 127.0.0.1:9090) instead of the built-in sink. Direct requests go to
    /// it as they are (with the basic-auth header, without X-Scope-OrgID);
    /// upstream connections are not counted.
    #[arg(long, value_parser = loopback)]
    upstream: Option<SocketAddr>,
    /// Run only this row of each scenario: `direct`, `proxy`,
    /// `proxy+guessing`, `proxy+reloads`, `proxy+tracing`,
    /// `proxy+first-seen`, `nginx` (the
    /// reference gateway) or `faults` (all of the drill's phases), e.g. for
    /// the 10-minute soak.
    #[arg(long)]
    only: Option<String>,
    /// Run the proxied rows and the reference row this many times,
    /// alternated (proxy, nginx, proxy, nginx, …), each with a fresh
    /// process; the ratios per round and their median are printed after
    /// the table. The machine's drift between rows then weighs on both.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
}

fn loopback(value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value.parse().map_err(|e| format!("{value}: {e}"))?;
    if addr.ip().is_loopback() {
        Ok(addr)
    } else {
        Err(format!(
            "{addr} is not a loopback address: loadtest only targets this machine"
        ))
    }
}

/// What runs next to the workload in a proxied row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Alongside {
    Nothing,
    /// The scenario's password guessers (their answers in `guess_statuses`).
    Guessing,
    /// The scenario's tenants-file replacements (count in `reloads_applied`).
    Reloads,
    /// Nothing, but the proxy exports spans (to a second sink).
    Tracing,
    /// Nothing, but every query is new (`first_seen` scenarios).
    FirstSeen,
}

impl Alongside {
    fn target(self) -> &'static str {
        match self {
            Alongside::Nothing => "proxy",
            Alongside::Guessing => "proxy+guessing",
            Alongside::Reloads => "proxy+reloads",
            Alongside::Tracing => "proxy+tracing",
            Alongside::FirstSeen => "proxy+first-seen",
        }
    }
}

/// The proxy's `limits` section: `more` (YAML lines) and the scenario's
/// `limits_config`; empty if both are.
fn limits_section(scenario: &Scenario, more: &str) -> String {
    let keys: String = (scenario.limits_config.iter())
        .map(|(key, value)| format!("  {key}: {value}\n"))
        .collect();
    match (more, keys.as_str()) {
        ("", "") => String::new(),
        _ => format!("limits:\n{more}{keys}"),
    }
}

/// One measured run through a fresh proxy process.
async fn proxied(
    scenario: &Scenario,
    workload: &Arc<Workload>,
    connections_opened: &dyn Fn() -> Option<u64>,
    options: proxy_process::Options<'_>,
    alongside: Alongside,
) -> anyhow::Result<Row> {
    let traces = match (alongside, &scenario.tracing) {
        (Alongside::Tracing, Some(tracing)) => Some((sink::start().await?, tracing.sample_ratio)),
        _ => None,
    };
    let mut extra_config = limits_section(scenario, "");
    if let Some(((addr, _), ratio)) = &traces {
        extra_config += &format!(
            "tracing:\n  otlp_endpoint: http://{addr}/v1/traces\n  sample_ratio: {ratio}\n  \
             export_interval: 1s\n"
        );
    }
    let proxy = ProxyProcess::start(&options, &extra_config).await?;
    let target = proxy.target()?;
    let idle = proxy_process::stats(proxy.pid())?;
    let pid = proxy.pid();
    // Held until the row is measured.
    let silent = hold_silent(scenario, proxy.addr, pid, || {
        proxy.metric("tenant_proxy_client_connections")
    })
    .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let bound = scenario.warmup + scenario.duration;
    let side_task = match (alongside, &scenario.guessing, &scenario.reloads) {
        (Alongside::Guessing, Some(g), _) => {
            let (g, stop, path, target) = (
                g.clone(),
                stop.clone(),
                scenario.requests[0].path.clone(),
                target.clone(),
            );
            let max = g.rate * bound.as_secs().max(1) * 2;
            Some(tokio::spawn(async move {
                Side::Guesses(load::guess(target, &g, &path, stop, max).await)
            }))
        }
        (Alongside::Reloads, _, Some(r)) => {
            let (every, path, tenants, stop) = (
                r.every,
                proxy.tenants_path(),
                options.tenants.to_owned(),
                stop.clone(),
            );
            let max = (bound.as_millis() / every.as_millis().max(1)) as u64 * 2;
            Some(tokio::spawn(async move {
                Side::Reloads(replace_tenants_file(&path, &tenants, every, stop, max).await)
            }))
        }
        _ => None,
    };
    let generation_before = proxy.metric("tenant_proxy_tenants_generation").await?;
    let mut connections = (None, None);
    let (outcome, process) =
        run_measured(target, scenario, workload, pid, |starting| match starting {
            true => connections.0 = connections_opened(),
            false => connections.1 = connections_opened(),
        })
        .await;
    stop.store(true, Ordering::Release);
    let side = match side_task {
        Some(task) => Some(task.await?),
        None => None,
    };
    let peak = proxy_process::stats(pid)?;
    let target = alongside.target();
    let opened = connections
        .1
        .zip(connections.0)
        .map(|(end, start)| end - start);
    let mut row = Row::new(&scenario.name, target, &outcome, opened);
    row.measure_process(&process.0, &process.1);
    row.proxy_idle_rss_mib = Some(idle.rss_kib as f64 / 1024.0);
    row.proxy_peak_rss_mib = Some(peak.peak_rss_kib as f64 / 1024.0);
    match side {
        Some(Side::Guesses(statuses)) => row.guess_statuses = Some(statuses),
        Some(Side::Reloads(written)) => {
            let generation = proxy.metric("tenant_proxy_tenants_generation").await?;
            row.reloads = Some(Reloads {
                written,
                applied: (generation - generation_before) as u64,
            });
        }
        None => {}
    }
    row.trace_exports = traces.map(|((_, stats), _)| stats.requests.load(Ordering::Relaxed));
    row.silent = silent.map(silent_row);
    Ok(row)
}

/// The scenario's silent connections to the gateway at `addr` (process
/// `pid`, its own count of open connections `counted`), if it has any.
async fn hold_silent<F: std::future::Future<Output = anyhow::Result<f64>>>(
    scenario: &Scenario,
    addr: SocketAddr,
    pid: u32,
    counted: impl Fn() -> F,
) -> anyhow::Result<Option<(Vec<tokio::net::TcpStream>, f64)>> {
    match scenario.silent_connections {
        0 => Ok(None),
        count => proxy_process::open_silent(addr, pid, count, counted)
            .await
            .map(Some),
    }
}

/// What a row reports of its silent connections, which it held until now.
fn silent_row((held, rss_added_mib): (Vec<tokio::net::TcpStream>, f64)) -> Silent {
    Silent {
        connections: held.len(),
        rss_added_mib,
    }
}

/// Runs the workload against `target`, sampling process `pid` (its CPU
/// and memory) when the measured interval starts and ends; `also` runs at
/// the same two moments (`true` at the start).
async fn run_measured(
    target: impl Into<load::Target>,
    scenario: &Scenario,
    workload: &Arc<Workload>,
    pid: u32,
    mut also: impl FnMut(bool),
) -> (load::Outcome, (ProcessStats, ProcessStats)) {
    let mut process = (ProcessStats::default(), ProcessStats::default());
    let outcome = load::run(target, scenario, workload.clone(), |starting| {
        let now = proxy_process::stats(pid).unwrap_or_default();
        match starting {
            true => process.0 = now,
            false => process.1 = now,
        }
        also(starting);
    })
    .await;
    (outcome, process)
}

/// The workload through the nginx reference gateway, its CPU measured like
/// the proxy's.
async fn through_nginx(
    scenario: &Scenario,
    workload: &Arc<Workload>,
    upstream: SocketAddr,
    access_log: bool,
) -> anyhow::Result<Row> {
    let https = scenario.transport == Transport::Https;
    let nginx = NginxProcess::start(upstream, scenario.users, access_log, https).await?;
    let pid = nginx.pid();
    let idle = proxy_process::stats(pid)?;
    let silent = hold_silent(scenario, nginx.addr, pid, || nginx.open_connections()).await?;
    let (outcome, process) = run_measured(nginx.target()?, scenario, workload, pid, |_| {}).await;
    let peak = proxy_process::stats(pid)?;
    let mut row = Row::new(&scenario.name, "nginx", &outcome, None);
    row.measure_process(&process.0, &process.1);
    row.proxy_idle_rss_mib = Some(idle.rss_kib as f64 / 1024.0);
    row.proxy_peak_rss_mib = Some(peak.peak_rss_kib as f64 / 1024.0);
    row.silent = silent.map(silent_row);
    Ok(row)
}

/// The workload split across `replicas` proxies in `tenant_limits.scope:
/// global` reading one tenants file (`replicas: N`): one row per proxy,
/// and the sum admitted against the global limit on stderr.
async fn global_limits(
    scenario: &Scenario,
    workload: &Arc<Workload>,
    options: proxy_process::Options<'_>,
    limits: &GlobalLimits,
) -> anyhow::Result<Vec<Row>> {
    let mut tenants: serde_json::Value = serde_json::from_str(options.tenants)?;
    tenants["replicas"] = limits.replicas.into();
    let tenants = tenants.to_string();
    let config = format!(
        "tenant_limits:\n  scope: global\n  default:\n    push: {{requests_per_second: {}, burst: 1}}\n",
        limits.push_requests_per_second
    );
    let mut proxies = Vec::new();
    for _ in 0..limits.replicas {
        let options = proxy_process::Options {
            tenants: &tenants,
            ..options
        };
        proxies.push(ProxyProcess::start(&options, &config).await?);
    }
    let targets = proxies
        .iter()
        .map(ProxyProcess::target)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runs = proxies
        .iter()
        .zip(targets)
        .map(|(proxy, target)| async move {
            let (outcome, process) =
                run_measured(target, scenario, workload, proxy.pid(), |_| {}).await;
            let mut row = Row::new(&scenario.name, "proxy-global", &outcome, None);
            row.measure_process(&process.0, &process.1);
            row
        });
    let rows = futures::future::join_all(runs).await;
    let admitted: f64 = rows
        .iter()
        .map(|row| {
            let all: u64 = row.statuses.values().sum();
            let ok: u64 = (200..300).filter_map(|code| row.statuses.get(&code)).sum();
            row.requests_per_second * ok as f64 / all.max(1) as f64
        })
        .sum();
    let limit = limits.push_requests_per_second;
    eprintln!(
        "{}: {} replicas admitted {admitted:.1} pushes/s together; global limit {limit}/s ({:+.1} %)",
        scenario.name,
        limits.replicas,
        (admitted / limit - 1.0) * 100.0
    );
    Ok(rows)
}

/// The workload through one proxy whose upstream misbehaves phase by phase,
/// a healthy phase before and after each fault: what clients get during a
/// fault, and that the proxy recovers without a restart.
async fn fault_drill(
    scenario: &Scenario,
    workload: &Arc<Workload>,
    options: proxy_process::Options<'_>,
    faults: &Faults,
) -> anyhow::Result<Vec<Row>> {
    let relay = FaultyUpstream::start(options.upstream).await?;
    let limits = limits_section(
        scenario,
        &format!(
            "  upstream_timeout: {}ms\n",
            faults.upstream_timeout.as_millis()
        ),
    );
    let options = proxy_process::Options {
        upstream: relay.addr,
        ..options
    };
    let proxy = ProxyProcess::start(&options, &limits).await?;
    let target = proxy.target()?;
    let mut phase = scenario.clone();
    (phase.duration, phase.warmup) = (faults.phase, Duration::ZERO);
    let mut rows = Vec::new();
    for fault in [
        Fault::Healthy,
        Fault::Refuse,
        Fault::Healthy,
        Fault::ResetInHead,
        Fault::Healthy,
        Fault::ResetInBody,
        Fault::Healthy,
        Fault::Stall,
        Fault::Healthy,
    ] {
        relay.set(fault);
        let before = proxy_process::stats(proxy.pid())?;
        let outcome = load::run(target.clone(), &phase, workload.clone(), |_| {}).await;
        let after = proxy_process::stats(proxy.pid())?;
        let mut row = Row::new(&scenario.name, fault.name(), &outcome, None);
        row.measure_process(&before, &after);
        rows.push(row);
    }
    Ok(rows)
}

enum Side {
    Guesses(std::collections::BTreeMap<u16, u64>),
    Reloads(u64),
}

/// Replaces the tenants file by rename every `every` (trailing whitespace
/// makes each version new to the proxy: JSON has no comments) until
/// stopped; returns how many were written.
async fn replace_tenants_file(
    path: &std::path::Path,
    tenants: &str,
    every: Duration,
    stop: Arc<AtomicBool>,
    max: u64,
) -> u64 {
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await; // the first tick is immediate: the proxy just loaded it
    let staging = path.with_extension("staging");
    let mut written = 0;
    while !stop.load(Ordering::Acquire) && written < max {
        ticks.tick().await;
        let version = format!("{tenants}{}", " ".repeat(written as usize + 1));
        let replaced = tokio::fs::write(&staging, version).await.is_ok()
            && tokio::fs::rename(&staging, path).await.is_ok();
        written += u64::from(replaced);
    }
    written
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Clients and the sink share this process: two descriptors a
    // connection, as the proxy's own (which it raises itself).
    tenant_proxy::ops::open_files::raise_for(4096);
    let binary = cli.proxy_bin.unwrap_or_else(proxy_process::default_binary);
    let (upstream, sink_stats) = match cli.upstream {
        Some(addr) => (addr, None),
        None => {
            let (addr, stats) = sink::start().await?;
            (addr, Some(stats))
        }
    };
    let connections_opened = || sink_stats.as_ref().map(|s| s.connections());
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

        let wanted = |target: &str| cli.only.as_deref().is_none_or(|only| only == target);
        if wanted("direct") {
            let before = connections_opened();
            let direct = load::run(upstream, &scenario, workload.clone(), |_| {}).await;
            let opened = connections_opened()
                .zip(before)
                .map(|(end, start)| end - start);
            rows.push(Row::new(&scenario.name, "direct", &direct, opened));
        }

        let extra = scenario.reloads.as_ref().map_or(0, |r| r.extra_credentials);
        let tenants = proxy_process::tenants_file(scenario.users, extra);
        let metrics_extra: String = scenario
            .metrics_config
            .iter()
            .map(|(key, value)| format!("  {key}: {value}\n"))
            .collect();
        let options = proxy_process::Options {
            binary: binary.as_path(),
            upstream,
            tenants: tenants.as_str(),
            logging: Logging {
                access_log: cli.access_log,
                json: cli.log_format == "json",
            },
            throttle: scenario.guessing.is_some(),
            mode: scenario.metrics_mode,
            metrics_extra: metrics_extra.as_str(),
            https: scenario.transport == Transport::Https,
        };
        let mut runs = vec![Alongside::Nothing];
        if scenario.guessing.is_some() {
            runs.push(Alongside::Guessing);
        }
        if scenario.reloads.is_some() {
            runs.push(Alongside::Reloads);
        }
        if scenario.tracing.is_some() {
            runs.push(Alongside::Tracing);
        }
        if scenario.first_seen {
            runs.push(Alongside::FirstSeen);
        }
        runs.retain(|alongside| wanted(alongside.target()));
        let fresh = Arc::new(workload.with_fresh_queries());
        let round_of = |round| (cli.rounds > 1).then_some(round);
        for round in 1..=cli.rounds {
            for &alongside in &runs {
                let workload = match alongside {
                    Alongside::FirstSeen => &fresh,
                    _ => &workload,
                };
                let row = proxied(&scenario, workload, &connections_opened, options, alongside);
                let mut row = row.await?;
                row.round = round_of(round);
                rows.push(row);
            }
            if let (Some(Reference::Nginx), true) = (scenario.reference, wanted("nginx")) {
                let mut row = through_nginx(&scenario, &workload, upstream, cli.access_log).await?;
                row.round = round_of(round);
                rows.push(row);
            }
        }
        if let (Some(limits), true) = (&scenario.global_limits, wanted("global")) {
            rows.extend(global_limits(&scenario, &workload, options, limits).await?);
        }
        if let (Some(faults), true) = (&scenario.faults, wanted("faults")) {
            rows.extend(fault_drill(&scenario, &workload, options, faults).await?);
        }
    }
    print!("{}", report::table(&rows));
    print!("{}", report::reference_ratios(&rows));
    if let Some(path) = cli.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
