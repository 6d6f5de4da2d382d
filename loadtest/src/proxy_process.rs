//! The proxy under test, as its own process (so its CPU time is its own):
//! a generated tenants file and config, started, waited for, measured
//! through /proc, and stopped by its PID.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustls_pki_types::CertificateDer;
use tenant_proxy::config::MetricsMode;

use crate::load::Target;

pub struct ProxyProcess {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// The tenant listener's certificate, when it serves TLS.
    certificate: Option<CertificateDer<'static>>,
    child: Child,
    dir: ScratchDir,
}

/// A directory of its own for one process the load generator starts (a
/// proxy, nginx): several run at once, in one test binary too, so the
/// name counts up within this process. Removed when dropped (written here:
/// the loadtest binary has no dev-dependencies such as `tempfile` at run
/// time).
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(prefix: &str) -> std::io::Result<Self> {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// CPU time (user + system) and peak RSS of a process.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessStats {
    pub cpu: Duration,
    /// Of `cpu`, the time in user space (the rest is the kernel's).
    pub user: Duration,
    pub peak_rss_kib: u64,
    pub rss_kib: u64,
    /// Open file descriptors (sockets included).
    pub open_fds: u64,
}

pub fn stats(pid: u32) -> std::io::Result<ProcessStats> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) in parentheses.
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let user_ticks: u64 = fields[11].parse().unwrap_or(0);
    let ticks = user_ticks + fields[12].parse::<u64>().unwrap_or(0);
    let time = |ticks: u64| Duration::from_micros(ticks * 1_000_000 / clock_ticks());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(ProcessStats {
        cpu: time(ticks),
        user: time(user_ticks),
        peak_rss_kib: kib("VmHWM:"),
        rss_kib: kib("VmRSS:"),
        open_fds: std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64,
    })
}

fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// The `tenant-proxy` binary built next to this one.
pub fn default_binary() -> PathBuf {
    let me = std::env::current_exe().expect("own path");
    me.parent().expect("a directory").join("tenant-proxy")
}

pub fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `users` credentials `user-<i>` / `pw-<i>`, one tenant each, hashed with
/// the proxy's real (default) argon2id parameters; then `extra` credentials
/// `extra-<i>`, one tenant each, sharing one hash. JSON, as tenant-sync
/// writes it.
pub fn tenants_file(users: usize, extra: usize) -> String {
    let hashes: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..users)
            .map(|i| {
                scope.spawn(move || {
                    tenant_proxy::auth::password::hash_password(&format!("pw-{i}")).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut tenants: Vec<serde_json::Value> = hashes
        .iter()
        .enumerate()
        .map(|(i, hash)| {
            serde_json::json!({"id": format!("tenant-{i}"),
                "users": [{"username": format!("user-{i}"), "password_hash": hash}]})
        })
        .collect();
    if let Some(shared) = hashes.first() {
        tenants.extend((0..extra).map(|i| {
            serde_json::json!({"id": format!("extra-{i}"),
                "users": [{"username": format!("extra-{i}"), "password_hash": shared}]})
        }));
    }
    let mut out =
        serde_json::to_string_pretty(&serde_json::json!({"version": 1, "tenants": tenants}))
            .expect("JSON");
    out.push('\n');
    out
}

/// How a proxy logs: its access log on or off, text or JSON lines.
#[derive(Clone, Copy, Debug, Default)]
pub struct Logging {
    pub access_log: bool,
    pub json: bool,
}

/// How a proxy process is started.
#[derive(Clone, Copy)]
pub struct Options<'a> {
    pub binary: &'a Path,
    pub upstream: SocketAddr,
    /// The tenants file's text.
    pub tenants: &'a str,
    pub logging: Logging,
    /// Keep the proxy's failure throttles at their defaults (off otherwise,
    /// so argon2's full cost is measured).
    pub throttle: bool,
    /// Metrics label mode (PromQL and remote write rewritten) or header
    /// mode (forwarded as they came, with the tenant header).
    pub mode: MetricsMode,
    /// More keys of the `metrics` section, as YAML lines.
    pub metrics_extra: &'a str,
    /// The tenant listener serves TLS, with a certificate made for this
    /// process ([`ProxyProcess::target`] trusts it).
    pub https: bool,
}

impl ProxyProcess {
    /// `extra_config`: more top-level sections (`tracing`, `limits`).
    pub async fn start(options: &Options<'_>, extra_config: &str) -> anyhow::Result<Self> {
        let dir = ScratchDir::new("tenant-proxy-loadtest")?;
        let Options {
            binary,
            upstream,
            tenants,
            logging,
            throttle,
            mode,
            metrics_extra,
            https,
        } = *options;
        std::fs::write(dir.path().join("tenants.yaml"), tenants)?;
        let certificate = https.then(|| write_certificate(dir.path())).transpose()?;
        let (addr, admin) = (free_port(), free_port());
        std::fs::write(
            dir.path().join("config.yaml"),
            format!(
                "listen: {addr}\nadmin_listen: {admin}\ntenants_file: tenants.yaml\n\
                 logs:\n  upstream: http://{upstream}\nmetrics:\n  upstream: http://{upstream}\n  mode: {}\n{metrics_extra}{}{}{extra_config}",
                match mode {
                    MetricsMode::Label => "label",
                    MetricsMode::Header => "header",
                },
                if throttle { "" } else { "auth:\n  max_failures_per_client: 0\n  max_failures_per_user: 0\n" },
                if https { "tls:\n  cert_file: cert.pem\n  key_file: key.pem\n" } else { "" },
            ),
        )?;
        let log = if logging.access_log {
            "info"
        } else {
            "info,access=off"
        };
        let child = Command::new(binary)
            .arg("--config")
            .arg(dir.path().join("config.yaml"))
            .env("RUST_LOG", log)
            .env(
                "TENANT_PROXY_LOG_FORMAT",
                if logging.json { "json" } else { "text" },
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "starting {}: {e} (build it: cargo build --release -p tenant-proxy)",
                    binary.display()
                )
            })?;
        let process = Self {
            addr,
            admin,
            certificate,
            child,
            dir,
        };
        process.wait_ready().await?;
        Ok(process)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where clients reach the tenant listener, and how.
    pub fn target(&self) -> anyhow::Result<Target> {
        Target::of_gateway(self.addr, self.certificate.as_ref())
    }

    pub fn tenants_path(&self) -> PathBuf {
        self.dir.path().join("tenants.yaml")
    }

    /// A value from the proxy's `/metrics`, e.g. `tenant_proxy_tenants_generation`.
    pub async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let reply = http_get(self.admin, "/metrics").await?;
        reply
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("{name} not in /metrics"))
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(reply) = http_get(self.admin, "/readyz").await {
                if reply.starts_with("HTTP/1.1 200") {
                    return Ok(());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the proxy did not become ready in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Opens `count` plain connections to the gateway at `addr` (process
/// `pid`) that send nothing, and waits until the gateway's own count of
/// open connections (`counted`: the proxy's
/// `tenant_proxy_client_connections`, nginx's `stub_status`) has them all,
/// its signal that each was accepted. Returns them, for the caller to hold,
/// and what they added to the process's RSS, in MiB.
pub async fn open_silent<F: Future<Output = anyhow::Result<f64>>>(
    addr: SocketAddr,
    pid: u32,
    count: usize,
    counted: impl Fn() -> F,
) -> anyhow::Result<(Vec<tokio::net::TcpStream>, f64)> {
    let before = stats(pid)?.rss_kib;
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        held.push(tokio::net::TcpStream::connect(addr).await?);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while counted().await? < count as f64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{addr} did not count {count} silent connections open in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = stats(pid)?.rss_kib;
    Ok((held, after.saturating_sub(before) as f64 / 1024.0))
}

/// A self-signed certificate for 127.0.0.1, written to `dir` as
/// `cert.pem` and `key.pem`.
pub fn write_certificate(dir: &Path) -> anyhow::Result<CertificateDer<'static>> {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])?;
    std::fs::write(dir.join("cert.pem"), made.cert.pem())?;
    std::fs::write(dir.join("key.pem"), made.signing_key.serialize_pem())?;
    Ok(made.cert.der().clone())
}

/// A whole HTTP/1.1 response, head included (admin endpoints are small).
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    Ok(reply)
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}
