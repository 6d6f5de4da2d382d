//! The reference-ratio summary printed after the table, and what a row's
//! table line says beside its statuses.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use loadtest::load::Outcome;
use loadtest::report::{median, reference_ratios, table, Row, Silent};

fn row(scenario: &str, target: &'static str, round: Option<u32>, cpu: f64) -> Row {
    row_in_user_space(scenario, target, round, cpu, None)
}

fn row_in_user_space(
    scenario: &str,
    target: &'static str,
    round: Option<u32>,
    cpu: f64,
    user: Option<f64>,
) -> Row {
    let outcome = Outcome {
        elapsed: Duration::from_secs(1),
        latency_us: Histogram::new(3).unwrap(),
        statuses: BTreeMap::from([(200, 1000)]),
        transport_errors: 0,
    };
    let mut row = Row::new(scenario, target, &outcome, None);
    row.round = round;
    row.proxy_cpu_us_per_request = Some(cpu);
    row.proxy_user_us_per_request = user;
    row
}

#[test]
fn medians_of_odd_and_even_counts() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    assert!(median(&[]).is_nan());
}

#[test]
fn each_round_is_compared_with_the_reference_of_the_same_round() {
    let rows = vec![
        row("loki", "direct", None, 0.0),
        row("loki", "proxy", Some(1), 60.0),
        row("loki", "nginx", Some(1), 50.0),
        row("loki", "proxy", Some(2), 40.0),
        row("loki", "nginx", Some(2), 50.0),
        row("loki", "proxy", Some(3), 55.0),
        row("loki", "nginx", Some(3), 44.0),
        row("promql", "proxy", None, 20.0),
    ];
    let summary = reference_ratios(&rows);
    let lines: Vec<&str> = summary
        .lines()
        .filter(|l| l.starts_with("| loki"))
        .collect();
    // Ratios 1.20, 0.80, 1.25: median 1.20; medians 55 / 50 = 1.10.
    assert_eq!(
        lines,
        ["| loki | 60.0, 40.0, 55.0 | 50.0, 50.0, 44.0 | 1.20, 0.80, 1.25 | 1.20× | 1.10× | – | – |"]
    );
    assert!(
        !summary.contains("promql"),
        "a scenario without a reference row has no ratio: {summary}"
    );
}

#[test]
fn no_reference_rows_no_summary() {
    let rows = vec![row("promql", "proxy", None, 20.0)];
    assert_eq!(reference_ratios(&rows), "");
}

#[test]
fn user_space_and_kernel_are_split_by_their_medians() {
    let rows = vec![
        row_in_user_space("loki", "proxy", Some(1), 11.0, Some(4.0)),
        row_in_user_space("loki", "nginx", Some(1), 10.0, Some(3.0)),
        row_in_user_space("loki", "proxy", Some(2), 12.0, Some(5.0)),
        row_in_user_space("loki", "nginx", Some(2), 9.0, Some(2.0)),
        row_in_user_space("loki", "proxy", Some(3), 11.5, Some(4.4)),
        row_in_user_space("loki", "nginx", Some(3), 9.5, Some(2.8)),
    ];
    let summary = reference_ratios(&rows);
    let line = summary.lines().find(|l| l.starts_with("| loki")).unwrap();
    // User: medians 4.4 and 2.8; kernel: 7.0, 7.0, 7.1 against 7.0, 7.0, 6.7.
    assert!(line.ends_with("| 4.4 / 2.8 | 7.0 / 7.0 |"), "{line}");
}

/// Silent connections' memory is given in all and per connection, beside
/// the statuses, so a row says what it held while it was measured.
#[test]
fn silent_connections_are_reported_in_all_and_each() {
    let mut held = row("loki-silent-connections", "proxy", None, 20.0);
    held.silent = Some(Silent {
        connections: 2000,
        rss_added_mib: 9.5,
    });
    let plain = row("loki-query-range", "proxy", None, 20.0);
    let printed = table(&[held, plain]);
    let lines: Vec<&str> = printed.lines().collect();
    assert!(
        lines[2].contains("200×1000 (2000 silent connections: +9.5 MiB, 4.9 KiB each)"),
        "{}",
        lines[2]
    );
    assert!(!lines[3].contains("silent"), "{}", lines[3]);
}
