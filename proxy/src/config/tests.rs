use super::*;
use crate::enforce::remote_write;

const MINIMAL: &str = "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:8081\ntenants_file: t.yaml\nlogs:\n  upstream: http://127.0.0.1:3100\n";

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::parse(MINIMAL).unwrap();
    assert_eq!(c.limits.max_body_bytes, 16 * 1024 * 1024);
    assert_eq!(c.tenants_poll_interval, Duration::from_secs(5));
    assert_eq!(c.limits.max_connections, 4096);
    assert_eq!(c.limits.max_connections_per_address, 0, "no cap by default");
    assert!(c.metrics.is_none());
}

#[test]
fn a_request_head_is_bounded_both_ways() {
    for (bytes, accepted) in [
        (8191, false),
        (8192, true),
        (1 << 20, true),
        ((1 << 20) + 1, false),
    ] {
        let config = format!("{MINIMAL}limits:\n  max_header_bytes: {bytes}\n");
        match Config::parse(&config) {
            Ok(c) => assert!(accepted && c.limits.max_header_bytes == bytes, "{bytes}"),
            Err(e) => assert!(
                !accepted && e.contains("limits.max_header_bytes must be between 8192"),
                "{bytes}: {e}"
            ),
        }
    }
}

/// `section.key` below `least` is refused, naming the key and its floor;
/// `least` itself is taken.
fn assert_at_least(section: &str, key: &str, least: u64, read: fn(&Config) -> u64) {
    let below = format!("{MINIMAL}{section}:\n  {key}: {}\n", least - 1);
    let err = Config::parse(&below).unwrap_err();
    let floor = format!("{section}.{key} must be at least {least}");
    assert!(err.contains(&floor), "{err}");
    let at = Config::parse(&format!("{MINIMAL}{section}:\n  {key}: {least}\n")).unwrap();
    assert_eq!(read(&at), least, "{section}.{key}");
}

#[test]
fn a_fixed_receive_buffer_is_at_least_16_kib() {
    let read = |c: &Config, setting| match setting {
        "upstream" => c.limits.upstream_receive_buffer_bytes,
        _ => c.limits.client_receive_buffer_bytes,
    };
    for setting in ["upstream", "client"] {
        for (bytes, accepted) in [
            (0, true),
            (1, false),
            (16383, false),
            (16384, true),
            (1 << 20, true),
        ] {
            let config = format!("{MINIMAL}limits:\n  {setting}_receive_buffer_bytes: {bytes}\n");
            match Config::parse(&config) {
                Ok(c) => assert!(accepted && read(&c, setting) == bytes, "{setting} {bytes}"),
                Err(e) => assert!(
                    !accepted
                        && e.contains(&format!(
                            "{setting}_receive_buffer_bytes must be 0 (the kernel's) or at least 16384"
                        )),
                    "{setting} {bytes}: {e}"
                ),
            }
        }
    }
}

#[test]
fn a_request_head_holds_at_least_32_fields() {
    assert_at_least("limits", "max_header_count", 32, |c| {
        c.limits.max_header_count as u64
    });
}

/// Tenants must not reach `/metrics` and `/readyz`: one address for both
/// listeners is refused, but port 0 twice (two ports the system picks, as
/// the tests run it) is two listeners.
#[test]
fn the_admin_listener_is_apart_from_the_tenants_one() {
    let same = MINIMAL.replace("127.0.0.1:8081", "127.0.0.1:8080");
    let err = Config::parse(&same).unwrap_err();
    assert!(
        err.contains("`listen` and `admin_listen` must differ"),
        "{err}"
    );
    let picked = MINIMAL.replace(":8080", ":0").replace(":8081", ":0");
    let c = Config::parse(&picked).unwrap();
    assert_eq!((c.listen.port(), c.admin_listen.port()), (0, 0));
}

#[test]
fn a_listener_takes_at_least_one_connection() {
    assert_at_least("limits", "max_connections", 1, |c| {
        c.limits.max_connections as u64
    });
    let c = Config::parse(&format!(
        "{MINIMAL}limits:\n  max_connections_per_address: 64\n"
    ))
    .unwrap();
    assert_eq!(c.limits.max_connections_per_address, 64);
    assert_at_least("auth", "verification_memory_bytes", 64 << 20, |c| {
        c.auth.verification_memory_bytes
    });
    assert_at_least("auth", "max_pending_verifications", 1, |c| {
        c.auth.max_pending_verifications as u64
    });
    assert_at_least("limits", "max_http2_streams", 1, |c| {
        u64::from(c.limits.max_http2_streams)
    });
}

#[test]
fn trusted_proxies_are_none_by_default_and_read_strictly() {
    let peer: std::net::IpAddr = "10.1.2.3".parse().unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("x-forwarded-for", "203.0.113.9".parse().unwrap());
    let none = Config::parse(MINIMAL).unwrap();
    assert_eq!(none.trusted_proxies.client(peer, &headers), peer);
    let set = Config::parse(&format!(
        "{MINIMAL}trusted_proxies: [10.0.0.0/8, fd00::1]\n"
    ))
    .unwrap();
    assert_eq!(
        set.trusted_proxies.client(peer, &headers),
        "203.0.113.9".parse::<std::net::IpAddr>().unwrap()
    );
    let err = Config::parse(&format!("{MINIMAL}trusted_proxies: [10.0.0.1/8]\n")).unwrap_err();
    assert!(
        err.contains("trusted_proxies: \"10.0.0.1/8\": host bits"),
        "{err}"
    );
}

#[test]
fn a_header_mode_prefix_without_a_push_upstream_is_warned_about() {
    let metrics = |rest: &str| {
        Config::parse(&format!("{MINIMAL}metrics:\n  mode: header\n{rest}"))
            .unwrap()
            .warnings()
    };
    let warned = metrics("  upstream: http://mimir:8080/prometheus\n");
    assert_eq!(warned.len(), 1);
    assert!(warned[0].contains("\"/prometheus\""), "{warned:?}");
    for fine in [
        "  upstream: http://mimir:8080/prometheus\n  push_upstream: http://mimir:8080\n",
        "  upstream: http://mimir:8080\n",
    ] {
        assert!(metrics(fine).is_empty(), "{fine}");
    }
    assert!(Config::parse(MINIMAL).unwrap().warnings().is_empty());
}

/// Thanos' tenant header scopes queries only with a flag the proxy cannot
/// see, and no Alertmanager scopes by it.
#[test]
fn a_header_other_than_x_scope_orgid_is_warned_about_and_takes_no_alerts() {
    let thanos = format!(
        "{MINIMAL}metrics:\n  upstream: http://thanos:9090\n  mode: header\n  header: THANOS-TENANT\n"
    );
    let warned = Config::parse(&thanos).unwrap().warnings();
    assert_eq!(warned.len(), 1, "{warned:?}");
    for flag in [
        "--query.enforce-tenancy",
        "--query.tenant-header",
        "--receive.tenant-header",
        "--receive.split-tenant-label-name",
    ] {
        assert!(warned[0].contains(flag), "{flag}: {warned:?}");
    }
    let err = Config::parse(&format!("{thanos}alerts:\n  upstream: http://am:9093\n")).unwrap_err();
    assert!(
        err.contains("no Alertmanager scopes by another header"),
        "{err}"
    );
    let mimir = format!(
        "{MINIMAL}metrics:\n  upstream: http://mimir:8080\n  mode: header\n  header: x-scope-orgid\n\
         alerts:\n  upstream: http://mimir:8080\n"
    );
    assert!(Config::parse(&mimir).unwrap().warnings().is_empty());
}

/// Only Loki can hold a restricted credential to its label policy, and the
/// proxy cannot see whether it was told to.
#[test]
fn lbac_is_warned_about_as_a_loki_setting_the_proxy_cannot_check() {
    let lbac = format!("{MINIMAL}  lbac: true\n");
    let warned = Config::parse(&lbac).unwrap().warnings();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("lbac: {enabled: true}"), "{warned:?}");
    let off = format!("{MINIMAL}  lbac: false\n");
    assert!(Config::parse(&off).unwrap().warnings().is_empty());
}

#[test]
fn trusting_every_address_is_warned_about() {
    for everyone in ["0.0.0.0/0", "::/0"] {
        let c = Config::parse(&format!(
            "{MINIMAL}trusted_proxies: [10.0.0.0/8, \"{everyone}\"]\n"
        ));
        let warnings = c.unwrap().warnings();
        assert!(
            warnings.len() == 1 && warnings[0].contains("any client"),
            "{warnings:?}"
        );
    }
    let c = Config::parse(&format!("{MINIMAL}trusted_proxies: [10.0.0.0/8]\n"));
    assert!(c.unwrap().warnings().is_empty());
}

#[test]
fn unknown_keys_name_their_line() {
    let err = Config::parse(&format!("{MINIMAL}colour: blue\n")).unwrap_err();
    assert!(
        err.contains("unknown field `colour`") && err.contains("line 6"),
        "{err}"
    );
}

proptest::proptest! {
    /// Taking the client's path and query as they came gives exactly
    /// the URI that building it gives, whether or not they match.
    #[test]
    fn reusing_the_received_uri_agrees_with_building_it(
        prefixed in proptest::bool::ANY,
        received in "/[a/?=]{0,8}",
        path in "/[a/]{0,4}",
        query in proptest::option::of("[a/?=]{0,4}"),
    ) {
        let upstream = Upstream::parse(if prefixed { "http://u:1/p" } else { "http://u:1" }).unwrap();
        let received: Uri = received.parse().unwrap();
        let reused = upstream.uri_reusing(&path, query.as_deref(), &received).unwrap();
        let built = upstream.uri_for(&path, query.as_deref()).unwrap();
        proptest::prop_assert_eq!(reused.to_string(), built.to_string());
    }
}

/// The point of `uri_reusing`: the received path and query are shared,
/// not copied and validated again, when nothing about them changes.
#[test]
fn an_unchanged_path_and_query_are_shared_not_rebuilt() {
    let upstream = Upstream::parse("http://u:1").unwrap();
    let received: Uri = "/loki/api/v1/query_range?query=x".parse().unwrap();
    let sent = received.path_and_query().unwrap().as_str();
    let reused = upstream
        .uri_reusing("/loki/api/v1/query_range", Some("query=x"), &received)
        .unwrap();
    assert_eq!(
        reused.to_string(),
        "http://u:1/loki/api/v1/query_range?query=x"
    );
    assert_eq!(
        reused.path_and_query().unwrap().as_str().as_ptr(),
        sent.as_ptr()
    );
    let rewritten = upstream
        .uri_reusing("/loki/api/v1/query_range", Some("query=y"), &received)
        .unwrap();
    assert_ne!(
        rewritten.path_and_query().unwrap().as_str().as_ptr(),
        sent.as_ptr()
    );
}

#[test]
fn upstream_prefix_is_kept_without_trailing_slash() {
    let u = Upstream::parse("http://mimir:8080/prometheus/").unwrap();
    assert_eq!(u.path_prefix, "/prometheus");
    let uri = u.uri_for("/api/v1/query", Some("query=up")).unwrap();
    assert_eq!(
        uri.to_string(),
        "http://mimir:8080/prometheus/api/v1/query?query=up"
    );
    assert!(Upstream::parse("https://x").is_ok());
    assert!(Upstream::parse("ftp://x").is_err());
    assert!(Upstream::parse("x:3100").is_err());
    // Credentials in the URL are refused, and the refusal never shows them.
    for raw in [
        "http://user:s3cret@loki:3100",
        "https://s3cret@loki/prefix",
        "http://user:s3cret@@loki",
        "http://user:s3cret@[::1",
    ] {
        let why = Upstream::parse(raw).unwrap_err();
        assert!(
            why.contains("credentials") && !why.contains("s3cret"),
            "{raw}: {why}"
        );
        let config = MINIMAL.replace("http://127.0.0.1:3100", raw);
        let why = Config::parse(&config).unwrap_err();
        assert!(
            why.contains("credentials") && !why.contains("s3cret"),
            "{raw}: {why}"
        );
    }
    // An `@` in the path or query is no credential.
    assert!(Upstream::parse("http://loki:3100/a@b").is_ok());
    // tls only with an https upstream, cert and key together.
    let base = MINIMAL.replace("http://127.0.0.1:3100", "http://x");
    let tls_on_http = format!("{base}  tls: {{ca_file: ca.crt}}\n");
    assert!(Config::parse(&tls_on_http).unwrap_err().contains("https"));
    let https = MINIMAL.replace("http://127.0.0.1:3100", "https://x");
    let half = format!("{https}  tls: {{cert_file: c.crt}}\n");
    assert!(Config::parse(&half).unwrap_err().contains("together"));
}

#[test]
fn metrics_section_is_validated() {
    let label = |name: &str| {
        Config::parse(&format!(
            "{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  label: \"{name}\"\n"
        ))
    };
    assert!(label("1x").unwrap_err().contains("not a valid label name"));
    for reserved in ["__name__", "__tenant"] {
        assert!(
            label(reserved).unwrap_err().contains("reserves"),
            "{reserved}"
        );
    }
    for own in ["le", "quantile", "otel_scope_name"] {
        assert!(label(own).unwrap_err().contains("sets itself"), "{own}");
    }
    assert_eq!(label("_tenant").unwrap().metrics.unwrap().label, "_tenant");
    assert_eq!(
        label("namespace")
            .unwrap()
            .metrics
            .unwrap()
            .query_cache_size,
        10_000
    );
    let no_cache =
        format!("{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  query_cache_size: 0\n");
    let metrics = Config::parse(&no_cache).unwrap().metrics.unwrap();
    assert_eq!(metrics.query_cache_size, 0);
    let cache = |n: usize| {
        Config::parse(&format!(
            "{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  query_cache_size: {n}\n"
        ))
    };
    assert_eq!(
        cache(MAX_QUERY_CACHE_SIZE)
            .unwrap()
            .metrics
            .unwrap()
            .query_cache_size,
        MAX_QUERY_CACHE_SIZE
    );
    assert!(cache(MAX_QUERY_CACHE_SIZE + 1)
        .unwrap_err()
        .contains("query_cache_size must be at most 100000"));
    let header = format!("{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  mode: header\n  header: THANOS-TENANT\n");
    assert_eq!(
        Config::parse(&header).unwrap().metrics.unwrap().mode,
        MetricsMode::Header
    );
    let underscored = header.replace("THANOS-TENANT", "THANOS_TENANT");
    assert!(Config::parse(&underscored)
        .unwrap_err()
        .contains("metrics.header \"THANOS_TENANT\" has a `_`"));
    let durations = format!("{MINIMAL}limits:\n  upstream_timeout: 1m 30s\n");
    assert_eq!(
        Config::parse(&durations).unwrap().limits.upstream_timeout,
        Duration::from_secs(90)
    );
}

#[test]
fn tracing_is_off_unless_configured_and_is_validated() {
    assert!(Config::parse(MINIMAL).unwrap().tracing.is_none());
    let on = format!("{MINIMAL}tracing:\n  otlp_endpoint: http://127.0.0.1:4318/v1/traces\n");
    let tracing = Config::parse(&on).unwrap().tracing.unwrap();
    assert_eq!(
        (tracing.service_name.as_str(), tracing.sample_ratio),
        ("tenant-proxy", 1.0)
    );
    for (bad, complaint) in [
        ("otlp_endpoint: 127.0.0.1:4318", "http://"),
        (
            "otlp_endpoint: http://c:4318\n  sample_ratio: 1.5",
            "sample_ratio",
        ),
        (
            "otlp_endpoint: http://c:4318\n  export_interval: 0s",
            "above zero",
        ),
        (
            "otlp_endpoint: http://c:4318\n  tls: {ca_file: ca.crt}",
            "https://",
        ),
        (
            "otlp_endpoint: https://c:4318\n  tls: {key_file: k}",
            "go together",
        ),
        ("otlp_endpoint: http://u:p@c:4318/v1/traces", "credentials"),
    ] {
        let text = format!("{MINIMAL}tracing:\n  {bad}\n");
        let error = Config::parse(&text).unwrap_err();
        assert!(error.contains(complaint), "{bad}: {error}");
    }
}

/// The four sections with TLS to an upstream, every upstream https://,
/// each with the `tls` block `tls(section)` gives.
fn every_upstream_over_tls(tls: impl Fn(&str) -> String) -> String {
    format!(
        "logs:\n  upstream: https://loki:3100\n{}\
         metrics:\n  upstream: https://prometheus:9090\n{}\
         alerts:\n  upstream: https://alertmanager:9093\n{}\
         tracing:\n  otlp_endpoint: https://collector:4318/v1/traces\n{}",
        tls("logs"),
        tls("metrics"),
        tls("alerts"),
        tls("tracing"),
    )
}

#[test]
fn every_relative_file_is_taken_from_the_config_files_directory() {
    let dir = tempfile::tempdir().unwrap();
    let upstreams = every_upstream_over_tls(|_| {
        "  tls:\n    ca_file: ca.pem\n    cert_file: client.pem\n    key_file: client.key\n".into()
    });
    let text = format!(
        "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:8081\ntenants_file: tenants.yaml\n\
         tls:\n  cert_file: server.pem\n  key_file: server.key\n  client_ca_file: clients.pem\n\
         {upstreams}"
    );
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).unwrap();
    let config = Config::load(&path).unwrap();

    let listener = config.tls.as_ref().unwrap();
    let mut files = vec![
        ("tenants_file", &config.tenants_file),
        ("tls.cert_file", &listener.cert_file),
        ("tls.key_file", &listener.key_file),
        (
            "tls.client_ca_file",
            listener.client_ca_file.as_ref().unwrap(),
        ),
    ];
    let upstreams = [
        ("logs", config.logs.as_ref().unwrap().tls.as_ref()),
        ("metrics", config.metrics.as_ref().unwrap().tls.as_ref()),
        ("alerts", config.alerts.as_ref().unwrap().tls.as_ref()),
        ("tracing", config.tracing.as_ref().unwrap().tls.as_ref()),
    ];
    for (section, tls) in upstreams {
        let tls = tls.unwrap_or_else(|| panic!("{section}.tls parsed"));
        for file in [&tls.ca_file, &tls.cert_file, &tls.key_file] {
            files.push((section, file.as_ref().unwrap()));
        }
    }
    for (field, file) in files {
        assert!(
            file.starts_with(dir.path()),
            "{field}: {} is not under the config's directory",
            file.display()
        );
    }
}

#[test]
fn a_zero_interval_or_timeout_is_refused_by_name() {
    let config = |zero: &str| {
        let value = |name: &str| if name == zero { "0s" } else { "1s" };
        let upstreams = every_upstream_over_tls(|section| {
            let reload = value(&format!("{section}.tls.reload_interval"));
            format!("  tls:\n    ca_file: ca.pem\n    reload_interval: {reload}\n")
        });
        format!(
            "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:8081\ntenants_file: t.yaml\n\
             tenants_poll_interval: {}\n\
             tls:\n  cert_file: c.pem\n  key_file: k.pem\n  reload_interval: {}\n\
             {upstreams}\
             limits:\n  header_read_timeout: {}\n  body_read_timeout: {}\n  upstream_timeout: {}\n\
             \x20 upstream_idle_timeout: {}\n\
             auth:\n  failure_window: {}\n",
            value("tenants_poll_interval"),
            value("tls.reload_interval"),
            value("limits.header_read_timeout"),
            value("limits.body_read_timeout"),
            value("limits.upstream_timeout"),
            value("limits.upstream_idle_timeout"),
            value("auth.failure_window"),
        )
    };
    Config::parse(&config("none")).expect("every duration above zero");
    for name in [
        "tenants_poll_interval",
        "tls.reload_interval",
        "logs.tls.reload_interval",
        "metrics.tls.reload_interval",
        "alerts.tls.reload_interval",
        "tracing.tls.reload_interval",
        "limits.header_read_timeout",
        "limits.body_read_timeout",
        "limits.upstream_timeout",
        "limits.upstream_idle_timeout",
        "auth.failure_window",
    ] {
        let error = Config::parse(&config(name)).unwrap_err();
        assert_eq!(error, format!("{name} must be above zero"));
    }
}

#[test]
fn tenant_limits_are_validated_by_name_in_the_default_and_every_override() {
    let config = |limits: &str| format!("{MINIMAL}tenant_limits:\n{limits}");
    let c = Config::parse(&config(
        "  default:\n    query: {requests_per_second: 5.5, burst: 7}\n    push: {bytes_per_second: 1024}\n\
         \x20 overrides:\n    team-a:\n      push: {concurrency: 3}\n  scope: global\n",
    ))
    .unwrap();
    assert_eq!(c.tenant_limits.default.query.requests_per_second, 5.5);
    assert_eq!(c.tenant_limits.default.query.burst, 7);
    assert_eq!(c.tenant_limits.default.push.bytes_per_second, 1024);
    assert_eq!(
        c.tenant_limits.overrides["team-a"]
            .push
            .unwrap()
            .concurrency,
        3
    );
    assert_eq!(c.tenant_limits.scope, LimitScope::Global);
    assert_eq!(
        Config::parse(MINIMAL).unwrap().tenant_limits.scope,
        LimitScope::Replica,
        "each replica enforces the whole limit unless told otherwise"
    );
    for (limits, error) in [
        (
            "  default:\n    query: {bytes_per_second: 1}\n",
            "tenant_limits.default.query.bytes_per_second applies to push only",
        ),
        (
            "  default:\n    push: {requests_per_second: -1}\n",
            "tenant_limits.default.push.requests_per_second must be 0 or more",
        ),
        (
            "  default:\n    query: {requests_per_second: .nan}\n",
            "tenant_limits.default.query.requests_per_second must be 0 or more",
        ),
        (
            "  default:\n    push: {requests_per_second: .inf}\n",
            "tenant_limits.default.push.requests_per_second must be 0 or more",
        ),
        (
            "  overrides:\n    team-a:\n      query: {bytes_per_second: 1}\n",
            "tenant_limits.overrides.team-a.query.bytes_per_second applies to push only",
        ),
        (
            "  overrides:\n    team-a:\n      push: {requests_per_second: -0.5}\n",
            "tenant_limits.overrides.team-a.push.requests_per_second must be 0 or more",
        ),
    ] {
        let err = Config::parse(&config(limits)).unwrap_err();
        assert!(err.contains(error), "{limits}: {err}");
    }
}

#[test]
fn remote_write_forward_compression_is_read_strictly() {
    let forward = |value: &str| {
        Config::parse(&format!(
            "{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  remote_write_forward_compression: {value}\n"
        ))
    };
    let read = |value| forward(value).unwrap().metrics.unwrap();
    assert_eq!(
        read("literal").remote_write_forward_compression,
        remote_write::Output::Literal
    );
    assert_eq!(
        read("compressed").remote_write_forward_compression,
        remote_write::Output::Compressed
    );
    let err = forward("none").unwrap_err();
    assert!(
        err.contains("unknown variant `none`")
            && err.contains("expected `compressed` or `literal`"),
        "{err}"
    );
}

/// docs/configuration.md's table of keys gives each default; writing
/// every one explicitly must change nothing, so the table and the code
/// cannot drift apart.
#[test]
fn every_documented_default_is_the_default() {
    use serde_yaml_ng::{Mapping, Value};
    let docs = include_str!("../../../docs/configuration.md");
    let table = docs
        .split_once("## Keys")
        .and_then(|(_, rest)| rest.split_once("\n#"))
        .expect("the Keys section")
        .0;
    let rows: Vec<(&str, &str)> = table
        .lines()
        .filter_map(|row| {
            let mut cells = row.strip_prefix("| `")?.split(" | ");
            Some((cells.next()?.strip_suffix('`')?, cells.next()?))
        })
        .collect();
    let keys: Vec<&str> = rows.iter().map(|(key, _)| *key).collect();
    // Every section present, so that each of its defaults applies.
    let base = "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:8081\ntenants_file: t.yaml\n\
                logs: {upstream: 'http://loki:3100'}\nmetrics: {upstream: 'http://prom:9090'}\n\
                tls: {cert_file: c.pem, key_file: k.pem}\n\
                tracing: {otlp_endpoint: 'http://otel:4318/v1/traces'}\n";
    let mut explicit: Value = serde_yaml_ng::from_str(base).unwrap();
    let mut written = Vec::new();
    for (key, default) in rows {
        // A literal in backquotes, not a prose default ("absent", "number
        // of CPUs") nor another key's value (`metrics.upstream`).
        let Some(literal) = default
            .strip_prefix('`')
            .and_then(|d| d.split_once('`'))
            .map(|(literal, _)| literal)
        else {
            continue;
        };
        if keys.contains(&literal) || key.contains(['`', '{']) {
            continue;
        }
        let mut section = &mut explicit;
        let mut path = key.split('.').peekable();
        while let Some(name) = path.next() {
            let map = section.as_mapping_mut().expect("a section is a map");
            if path.peek().is_none() {
                map.insert(name.into(), serde_yaml_ng::from_str(literal).unwrap());
                break;
            }
            section = map
                .entry(name.into())
                .or_insert_with(|| Value::Mapping(Mapping::new()));
        }
        written.push(key);
    }
    for key in [
        "tenants_poll_interval",
        "metrics.label",
        "metrics.header",
        "limits.max_decompressed_bytes",
        "limits.upstream_idle_timeout",
        "auth.verification_memory_bytes",
        "trusted_proxies",
        "tracing.sample_ratio",
    ] {
        assert!(written.contains(&key), "{key} not read from the table");
    }
    assert_eq!(written.len(), 39, "{written:?}");
    let defaults = Config::parse(base).unwrap();
    let explicit = Config::parse(&serde_yaml_ng::to_string(&explicit).unwrap()).unwrap();
    assert_eq!(format!("{explicit:#?}"), format!("{defaults:#?}"));
    assert_eq!(
        defaults.auth.max_concurrent_verifications,
        std::thread::available_parallelism().unwrap().get(),
        "the number of CPUs"
    );
}
