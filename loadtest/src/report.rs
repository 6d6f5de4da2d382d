//! One row per (scenario, target): a table for people, JSON for tools.

use serde::Serialize;

use crate::load::Outcome;
use crate::proxy_process::ProcessStats;

#[derive(Debug, Serialize)]
pub struct Row {
    pub scenario: String,
    /// `direct` (load generator → sink) or `proxy` (→ tenant-proxy → sink).
    pub target: &'static str,
    /// Which of `--rounds` this row belongs to (rows run once have none).
    pub round: Option<u32>,
    pub requests: u64,
    pub requests_per_second: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// Responses by status code.
    pub statuses: std::collections::BTreeMap<u16, u64>,
    pub transport_errors: u64,
    /// The proxy's user + system CPU time over the measured interval ÷ requests.
    pub proxy_cpu_us_per_request: Option<f64>,
    /// Of that, the time in user space; the rest is the kernel's (system
    /// calls, and on loopback the receiving side's TCP work).
    pub proxy_user_us_per_request: Option<f64>,
    /// New upstream connections per 1,000 requests (counted by the sink
    /// only).
    pub upstream_connections_per_1000: Option<f64>,
    pub proxy_idle_rss_mib: Option<f64>,
    pub proxy_peak_rss_mib: Option<f64>,
    /// What password guessers running alongside got, by status.
    pub guess_statuses: Option<std::collections::BTreeMap<u16, u64>>,
    /// Tenants-file replacements during the run.
    pub reloads: Option<Reloads>,
    /// The proxy process at the start and the end of the measured interval.
    pub measured: Option<Measured>,
    /// OTLP exports the trace sink received (tracing rows).
    pub trace_exports: Option<u64>,
    /// Connections held open and silent through the row, and what they
    /// added to the proxy's RSS.
    pub silent: Option<Silent>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Silent {
    pub connections: usize,
    pub rss_added_mib: f64,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Measured {
    pub rss_mib: (f64, f64),
    pub open_fds: (u64, u64),
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Reloads {
    /// Files written (by rename).
    pub written: u64,
    /// Generations the proxy loaded meanwhile (from its own metrics).
    pub applied: u64,
}

impl Row {
    /// The proxy's CPU per request and its RSS and descriptors, from its
    /// process stats at the start and the end of the measured interval.
    pub fn measure_process(&mut self, start: &ProcessStats, end: &ProcessStats) {
        let per_request = |time: std::time::Duration| {
            Some(time.as_secs_f64() * 1e6 / self.requests.max(1) as f64)
        };
        self.proxy_cpu_us_per_request = per_request(end.cpu - start.cpu);
        self.proxy_user_us_per_request = per_request(end.user - start.user);
        let mib = |kib: u64| kib as f64 / 1024.0;
        self.measured = Some(Measured {
            rss_mib: (mib(start.rss_kib), mib(end.rss_kib)),
            open_fds: (start.open_fds, end.open_fds),
        });
    }

    pub fn new(
        scenario: &str,
        target: &'static str,
        outcome: &Outcome,
        upstream_connections: Option<u64>,
    ) -> Self {
        let requests = outcome.requests();
        let q = |quantile: f64| outcome.latency_us.value_at_quantile(quantile) as f64 / 1000.0;
        Self {
            scenario: scenario.to_owned(),
            target,
            round: None,
            requests,
            requests_per_second: requests as f64 / outcome.elapsed.as_secs_f64(),
            p50_ms: q(0.5),
            p90_ms: q(0.9),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            statuses: outcome.statuses.clone(),
            transport_errors: outcome.transport_errors,
            proxy_cpu_us_per_request: None,
            proxy_user_us_per_request: None,
            upstream_connections_per_1000: upstream_connections
                .map(|opened| opened as f64 * 1000.0 / requests.max(1) as f64),
            proxy_idle_rss_mib: None,
            proxy_peak_rss_mib: None,
            guess_statuses: None,
            reloads: None,
            measured: None,
            trace_exports: None,
            silent: None,
        }
    }
}

pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | target | requests | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | statuses | proxy CPU µs/req | upstream conns/1k | proxy RSS idle/peak MiB |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n",
    );
    for r in rows {
        let target = match r.round {
            Some(round) => format!("{} #{round}", r.target),
            None => r.target.to_owned(),
        };
        let statuses: Vec<String> = r.statuses.iter().map(|(s, n)| format!("{s}×{n}")).collect();
        let mut errors = if r.transport_errors > 0 {
            format!(" err×{}", r.transport_errors)
        } else {
            String::new()
        };
        if let Some(guesses) = &r.guess_statuses {
            let g: Vec<String> = guesses.iter().map(|(s, n)| format!("{s}×{n}")).collect();
            errors.push_str(&format!(" (guessers: {})", g.join(" ")));
        }
        if let Some(reloads) = &r.reloads {
            errors.push_str(&format!(
                " (reloads: {} written, {} applied)",
                reloads.written, reloads.applied
            ));
        }
        if let Some(exports) = r.trace_exports {
            errors.push_str(&format!(" (OTLP exports: {exports})"));
        }
        if let Some(silent) = r.silent {
            let each_kib = silent.rss_added_mib * 1024.0 / silent.connections.max(1) as f64;
            errors.push_str(&format!(
                " ({} silent connections: +{:.1} MiB, {each_kib:.1} KiB each)",
                silent.connections, silent.rss_added_mib
            ));
        }
        let connections = r
            .upstream_connections_per_1000
            .map_or("–".into(), |c| format!("{c:.1}"));
        // A tenth of a µs: the Loki path costs about 10 µs a request, so
        // whole µs would hide differences of up to 10 %.
        let cpu = match (r.proxy_cpu_us_per_request, r.proxy_user_us_per_request) {
            (Some(cpu), Some(user)) => format!("{cpu:.1} ({user:.1} user)"),
            (Some(cpu), None) => format!("{cpu:.1}"),
            _ => "–".into(),
        };
        let rss = match (r.proxy_idle_rss_mib, r.proxy_peak_rss_mib) {
            (Some(idle), Some(peak)) => format!("{idle:.1} / {peak:.1}"),
            _ => "–".into(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {}{} | {} | {} | {} |\n",
            r.scenario,
            target,
            r.requests,
            r.requests_per_second,
            r.p50_ms,
            r.p90_ms,
            r.p99_ms,
            r.p999_ms,
            statuses.join(" "),
            errors,
            cpu,
            connections,
            rss
        ));
    }
    let measured: Vec<_> = rows.iter().filter_map(|r| Some((r, r.measured?))).collect();
    if !measured.is_empty() {
        out.push_str(
            "\n| scenario | target | proxy RSS MiB, start → end of the measured interval | open fds, start → end |\n|---|---|---|---|\n",
        );
        for (r, m) in measured {
            out.push_str(&format!(
                "| {} | {} | {:.1} → {:.1} | {} → {} |\n",
                r.scenario, r.target, m.rss_mib.0, m.rss_mib.1, m.open_fds.0, m.open_fds.1
            ));
        }
    }
    out
}

/// The proxy's CPU per request against the reference gateway's, round by
/// round: the ratio of each round (both measured back to back), their
/// median, and the ratio of the two medians. Empty when no scenario had a
/// reference row.
pub fn reference_ratios(rows: &[Row]) -> String {
    let mut out = String::new();
    let mut scenarios: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    for scenario in scenarios {
        let of = |target: &str| -> Vec<&Row> {
            rows.iter()
                .filter(|r| r.scenario == scenario && r.target == target)
                .filter(|r| r.proxy_cpu_us_per_request.is_some())
                .collect()
        };
        let nginx = of("nginx");
        let pairs: Vec<(&Row, &Row)> = of("proxy")
            .into_iter()
            .filter_map(|p| Some((p, *nginx.iter().find(|n| n.round == p.round)?)))
            .collect();
        if pairs.is_empty() {
            continue;
        }
        if out.is_empty() {
            out.push_str(
                "\n| scenario | proxy CPU µs/req by round | nginx CPU µs/req by round | ratio by round | median ratio | ratio of medians | user space, proxy / nginx (medians) | kernel, proxy / nginx (medians) |\n\
                 |---|---|---|---|---:|---:|---:|---:|\n",
            );
        }
        let cpu = |r: &Row| r.proxy_cpu_us_per_request.unwrap_or(f64::NAN);
        let user = |r: &Row| r.proxy_user_us_per_request.unwrap_or(f64::NAN);
        let kernel = |r: &Row| cpu(r) - user(r);
        let (proxy_rows, nginx_rows): (Vec<&Row>, Vec<&Row>) = pairs.into_iter().unzip();
        let column = |rows: &[&Row], of: &dyn Fn(&Row) -> f64| -> Vec<f64> {
            rows.iter().map(|r| of(r)).collect()
        };
        let (proxy, reference) = (column(&proxy_rows, &cpu), column(&nginx_rows, &cpu));
        let ratios: Vec<f64> = proxy.iter().zip(&reference).map(|(p, n)| p / n).collect();
        let list = |values: &[f64], decimals: usize| {
            let shown: Vec<String> = values.iter().map(|v| format!("{v:.decimals$}")).collect();
            shown.join(", ")
        };
        let split = |of: &dyn Fn(&Row) -> f64| {
            let (p, n) = (column(&proxy_rows, of), column(&nginx_rows, of));
            match p.iter().chain(&n).any(|v| v.is_nan()) {
                true => "–".to_owned(),
                false => format!("{:.1} / {:.1}", median(&p), median(&n)),
            }
        };
        out.push_str(&format!(
            "| {scenario} | {} | {} | {} | {:.2}× | {:.2}× | {} | {} |\n",
            list(&proxy, 1),
            list(&reference, 1),
            list(&ratios, 2),
            median(&ratios),
            median(&proxy) / median(&reference),
            split(&user),
            split(&kernel),
        ));
    }
    out
}

/// The middle value (the mean of the two middle ones for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}
