//! The `tenant-proxy` binary: helpers, start-up errors, and a real run
//! stopped by SIGTERM.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine;

mod support;
use support::certs::Ca;

const BIN: &str = env!("CARGO_BIN_EXE_tenant-proxy");

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/proxy")
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("TENANT_PROXY_CONFIG")
        .output()
        .unwrap()
}

/// The proxy with the example tenants, free ports and upstreams nobody
/// listens on, configured in a temporary directory (kept while it runs).
fn proxy_on_free_ports() -> (tempfile::TempDir, Command) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        examples().join("tenants.yaml"),
        dir.path().join("tenants.yaml"),
    )
    .unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: tenants.yaml\nlogs:\n  upstream: http://127.0.0.1:1\nmetrics:\n  upstream: http://127.0.0.1:1\n").unwrap();
    let mut command = Command::new(BIN);
    command.arg("--config").arg(&config);
    (dir, command)
}

#[test]
fn hash_password_prints_a_verifiable_argon2id_hash() {
    let mut child = Command::new(BIN)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let hash = String::from_utf8(out.stdout).unwrap();
    assert!(hash.starts_with("$argon2id$v=19$"), "{hash}");
    let verifier = tenant_proxy::auth::password::Verifier::argon2id(hash.trim()).unwrap();
    assert!(
        verifier.verify("s3cret"),
        "the trailing newline is not part of the password"
    );
}

#[test]
fn check_config_summarises_tenants_without_secrets() {
    let config = examples().join("config.yaml");
    let out = run(&["check-config", "--config", config.to_str().unwrap()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 tenant(s)"), "{stdout}");
    assert!(
        stdout.contains(
            "user grafana-a -> tenant team-a scopes [logs:read, metrics:read, rules:read, alerts:read]"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("tenant team-a namespaces [team-a, team-a-staging]"),
        "{stdout}"
    );
    assert!(!stdout.contains("argon2id"), "no hash in the summary");
}

/// A config with TLS on the listener and to every upstream, in `dir`,
/// its files written there (relative paths, as an operator would).
fn config_with_every_tls_file(dir: &Path) -> PathBuf {
    let ca = Ca::new();
    let leaf = ca.issue("proxy");
    for (name, pem) in [
        ("ca.pem", ca.pem()),
        ("cert.pem", leaf.cert_pem),
        ("key.pem", leaf.key_pem),
    ] {
        std::fs::write(dir.join(name), pem).unwrap();
    }
    std::fs::copy(examples().join("tenants.yaml"), dir.join("tenants.yaml")).unwrap();
    let tls = "  tls:\n    ca_file: ca.pem\n    cert_file: cert.pem\n    key_file: key.pem\n";
    let config = dir.join("c.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: tenants.yaml\n\
             tls:\n  cert_file: cert.pem\n  key_file: key.pem\n  client_ca_file: ca.pem\n\
             logs:\n  upstream: https://127.0.0.1:1\n{tls}\
             metrics:\n  upstream: https://127.0.0.1:1\n{tls}\
             alerts:\n  upstream: https://127.0.0.1:1\n{tls}\
             tracing:\n  otlp_endpoint: https://127.0.0.1:1/v1/traces\n{tls}"
        ),
    )
    .unwrap();
    config
}

#[test]
fn check_config_loads_every_tls_file_as_start_up_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_every_tls_file(dir.path());
    let config = config.to_str().unwrap();
    let out = run(&["check-config", "--config", config]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Each section's files in turn made unreadable as PEM: check-config
    // names the section and the file, as start-up would refuse to run.
    let text = std::fs::read_to_string(config).unwrap();
    for (section, line) in [
        ("tls", "  cert_file: cert.pem\n"),
        ("tls", "  client_ca_file: ca.pem\n"),
        (
            "logs.tls",
            "logs:\n  upstream: https://127.0.0.1:1\n  tls:\n    ca_file: ca.pem\n",
        ),
        (
            "metrics.tls",
            "metrics:\n  upstream: https://127.0.0.1:1\n  tls:\n    ca_file: ca.pem\n",
        ),
        (
            "alerts.tls",
            "alerts:\n  upstream: https://127.0.0.1:1\n  tls:\n    ca_file: ca.pem\n",
        ),
        ("tracing.tls", "/v1/traces\n  tls:\n    ca_file: ca.pem\n"),
    ] {
        assert!(text.contains(line), "{line:?} in the config");
        let broken = line.replace(".pem", "-missing.pem");
        std::fs::write(config, text.replacen(line, &broken, 1)).unwrap();
        let out = run(&["check-config", "--config", config]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{section}: {stderr}");
        assert!(
            stderr.contains(&format!("Error: {section}: ")) && stderr.contains("-missing.pem"),
            "{section}: {stderr}"
        );
    }
}

#[test]
fn invalid_config_exits_non_zero_naming_file_line_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: t.yaml\nlogz: {}\n",
    )
    .unwrap();
    let out = run(&["--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("line 4") && stderr.contains("logz"),
        "{stderr}"
    );
}

#[test]
fn invalid_tenants_file_at_start_up_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.yaml"), "tenants:\n  - id: \"a|b\"\n").unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: t.yaml\nlogs:\n  upstream: http://127.0.0.1:1\n").unwrap();
    let out = run(&["--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("t.yaml") && stderr.contains("line 2"),
        "{stderr}"
    );
}

#[test]
fn missing_config_flag_is_a_clear_error() {
    let out = run(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr).unwrap().contains("--config"));
}

/// The proxy's log lines (`--log-format json`), read on a thread of their
/// own so that waiting for one can give up.
fn log_lines(child: &mut std::process::Child) -> LogLines {
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let entry = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
            if tx.send(entry).is_err() {
                return;
            }
        }
    });
    rx
}

/// The first log line whose message is `message` and whose fields satisfy
/// `fields`, within 10 s; panics if the log ends or the time runs out.
fn wait_for_log(
    lines: &LogLines,
    message: &str,
    fields: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(entry) if entry["fields"]["message"] == message && fields(&entry["fields"]) => {
                return entry
            }
            Ok(_) => {}
            Err(e) => panic!("no log line {message:?}: {e}"),
        }
    }
}

type LogLines = std::sync::mpsc::Receiver<serde_json::Value>;

/// Starts the proxy with JSON logs and waits until it serves: the process,
/// its log lines after that one, and its listen and admin addresses.
fn spawn_serving(proxy: &mut Command) -> (std::process::Child, LogLines, String, String) {
    let mut child = proxy
        .args(["--log-format", "json"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = log_lines(&mut child);
    let serving = wait_for_log(&lines, "tenant-proxy serving", |_| true);
    let field = |name: &str| serving["fields"][name].as_str().unwrap().to_owned();
    (child, lines, field("listen"), field("admin"))
}

/// One HTTP/1.1 exchange on a connection of its own: the whole answer.
fn exchange(addr: &str, request: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut stream, &mut reply).unwrap();
    reply
}

const READYZ: &str = "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

fn signal(child: &std::process::Child, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

#[test]
fn sighup_rereads_the_tenants_file_and_the_proxy_keeps_serving() {
    // The tenants file is a link into a directory the proxy does not watch
    // (as a mounted ConfigMap's is) and the poll is an hour away: only
    // SIGHUP makes the proxy look at it again.
    let (dir, mut proxy) = proxy_on_free_ports();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::rename(dir.path().join("tenants.yaml"), data.join("tenants.yaml")).unwrap();
    std::os::unix::fs::symlink("data/tenants.yaml", dir.path().join("tenants.yaml")).unwrap();
    let config = dir.path().join("c.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}tenants_poll_interval: 1h\n")).unwrap();

    let (mut child, lines, _listen, admin) = spawn_serving(&mut proxy);

    // Each SIGHUP after an edit loads it. The first may also be read by
    // the reloader's first look at the file, as it starts after the log
    // line above; the second can only come from SIGHUP.
    let original = std::fs::read_to_string(data.join("tenants.yaml")).unwrap();
    for (generation, added) in [(2, 1), (3, 2)] {
        let new_tenants: String = (0..added)
            .map(|n| format!("  - id: team-new-{n}\n    namespaces: [team-new-{n}]\n"))
            .collect();
        let edited = original.replacen("tenants:\n", &format!("tenants:\n{new_tenants}"), 1);
        // Replaced by rename, as tenant-sync and kubelet do: the reloader
        // sees the old file or the new one, never half of one.
        std::fs::write(data.join("next.yaml"), edited).unwrap();
        std::fs::rename(data.join("next.yaml"), data.join("tenants.yaml")).unwrap();
        signal(&child, "HUP");
        let loaded = wait_for_log(&lines, "tenants file loaded", |f| {
            f["generation"] == generation
        });
        assert_eq!(loaded["fields"]["tenants"], 2 + added, "{loaded}");
    }

    // Still serving, and SIGTERM still stops it cleanly.
    let reply = exchange(&admin, READYZ);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    signal(&child, "TERM");
    let status = child.wait().unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}");
}

#[test]
fn runs_until_sigterm_then_exits_cleanly() {
    let (_dir, mut proxy) = proxy_on_free_ports();
    let (mut child, lines, listen, admin) = spawn_serving(&mut proxy);
    let reply = exchange(&admin, READYZ);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    // A query that makes promql-parser panic: answered 400, and the panic
    // is a JSON log line like any other: a warning (the tenant's query was
    // refused; the proxy is fine), where it happened, never the query.
    let auth = base64::engine::general_purpose::STANDARD.encode("team-b:team-b-password");
    let request = format!(
        "GET /api/v1/query?query=x%5B99999999999999999999999%5D HTTP/1.1\r\nHost: x\r\n\
         Authorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    );
    let reply = exchange(&listen, &request);
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains(r#""errorType":"bad_data""#), "{reply}");

    signal(&child, "TERM");
    let status = child.wait().unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}");
    // Every line up to the end: the reader's thread ends with the log.
    let rest: Vec<serde_json::Value> = lines.iter().collect();
    let logged = |message: &str| rest.iter().find(|e| e["fields"]["message"] == message);
    assert!(logged("tenant-proxy stopped").is_some(), "{rest:?}");
    let panic =
        logged("panic survived; its request is refused").expect("the parser's panic is logged");
    assert_eq!(panic["level"], "WARN", "{panic}");
    assert!(
        panic["fields"]["location"]
            .as_str()
            .is_some_and(|at| at.contains(".rs:")),
        "{panic}"
    );
    assert!(
        !panic.to_string().contains("99999999999999999999999"),
        "never the query"
    );
    assert!(
        rest.iter().all(|e| e["level"] != "ERROR"),
        "a tenant's query writes no error line: {rest:?}"
    );
}

/// `proxy` run by a shell that first sets `limits` (`ulimit ...`) on
/// itself; `exec` keeps the process id.
fn under_limits(limits: &str, proxy: &Command) -> Command {
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg(format!("{limits} && exec \"$0\" \"$@\""))
        .arg(proxy.get_program())
        .args(proxy.get_args())
        .args(["--log-format", "json"])
        .stderr(Stdio::piped());
    shell
}

/// `(soft, hard)` "Max open files" of a process, from /proc.
fn open_files_limit(pid: &str) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut numbers = line.split_whitespace().filter_map(|word| match word {
        "unlimited" => Some(u64::MAX),
        number => number.parse().ok(),
    });
    (numbers.next().unwrap(), numbers.next().unwrap())
}

/// Started with the soft limit many hosts give (here 256), the proxy
/// raises it to the hard limit: 4,096 connections need about 8,448.
#[test]
fn a_short_open_file_limit_is_raised_at_start() {
    let (_dir, proxy) = proxy_on_free_ports();
    let (_, hard) = open_files_limit("self");
    // An unlimited hard limit cannot be the soft one: what is needed then.
    let expected = if hard == u64::MAX { 8448 } else { hard };
    let mut child = under_limits("ulimit -Sn 256", &proxy).spawn().unwrap();
    let lines = log_lines(&mut child);
    let raised = wait_for_log(&lines, "open-file limit raised", |_| true);
    assert_eq!(raised["fields"]["from"], 256, "{raised}");
    assert_eq!(raised["fields"]["to"], expected, "{raised}");
    wait_for_log(&lines, "tenant-proxy serving", |_| true);
    assert_eq!(open_files_limit(&child.id().to_string()), (expected, hard));
    signal(&child, "TERM");
    assert!(child.wait().unwrap().success());
}

/// A hard limit too low to raise to what `limits.max_connections` needs is
/// said at start, with the numbers; the proxy serves anyway.
#[test]
fn an_open_file_limit_too_low_to_raise_is_a_warning() {
    let (_dir, proxy) = proxy_on_free_ports();
    let mut child = under_limits("ulimit -n 300", &proxy).spawn().unwrap();
    let lines = log_lines(&mut child);
    let warned = wait_for_log(
        &lines,
        "the open-file limit is below what limits.max_connections can need: \
         connections beyond it fail; raise the hard limit (systemd LimitNOFILE=, \
         ulimit -Hn) or lower limits.max_connections",
        |_| true,
    );
    assert_eq!(warned["level"], "WARN", "{warned}");
    assert_eq!(warned["fields"]["limit"], 300, "{warned}");
    assert_eq!(warned["fields"]["needed"], 8448, "{warned}");
    let serving = wait_for_log(&lines, "tenant-proxy serving", |_| true);
    let admin = serving["fields"]["admin"].as_str().unwrap();
    assert!(exchange(admin, READYZ).starts_with("HTTP/1.1 200"));
    signal(&child, "TERM");
    assert!(child.wait().unwrap().success());
}

#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let (_dir, mut proxy) = proxy_on_free_ports();
    let mut child = proxy
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut read = Vec::new();
    let serving = loop {
        let line = lines
            .next()
            .expect("the proxy logs that it serves")
            .unwrap();
        read.push(line.clone());
        if line.contains("tenant-proxy serving") {
            break line;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        read.iter().all(|line| !line.contains('\u{1b}')),
        "escape codes in a log written to a pipe: {read:?}"
    );
    assert!(
        serving.contains(" INFO tenant_proxy: tenant-proxy serving listen=127.0.0.1:"),
        "{serving}"
    );
}

#[test]
fn rewrite_prints_the_enforced_query_for_a_user_or_tenant() {
    let config = examples().join("config.yaml");
    let config = config.to_str().unwrap();
    let out = run(&[
        "rewrite",
        "--config",
        config,
        "--user",
        "grafana-a",
        "sum(rate(http_requests_total[5m]))",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "sum(rate(http_requests_total{namespace=~\"team-a|team-a-staging\"}[5m]))\n"
    );
    let out = run(&[
        "rewrite",
        "--config",
        config,
        "--tenant",
        "team-b",
        "--selector",
        "{job=\"api\"}",
    ]);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "{job=\"api\",namespace=\"team-b\"}\n"
    );
    let out = run(&[
        "rewrite",
        "--config",
        config,
        "--tenant",
        "team-b",
        "up{a=\"1\" or b=\"2\"}",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("`or` inside a label selector"));
    let out = run(&["rewrite", "--config", config, "--user", "nobody", "up"]);
    assert!(!out.status.success());
}
