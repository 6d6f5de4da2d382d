//! The reference gateway of issue #19: Debian's nginx configured as the Loki
//! chart's gateway is, in front of the same sink: basic auth against a
//! `{SHA}` htpasswd (unsalted SHA-1, no real password hashing), the tenant
//! from `map $remote_user`, upstream keepalive, and a per-request access log
//! when asked. Client keep-alive is unbounded, as the proxy's is: nginx's
//! default of 1,000 requests per connection made the load generator count
//! closed connections as errors. One process (`master_process off`, one worker), so its CPU is
//! measured like the proxy's. Beside `transport: https` proxy rows it
//! serves TLS and HTTP/2 as the proxy does then (the same kind of
//! certificate, made for the run; TLS 1.2 and 1.3, which nginx 1.22 does
//! not enable by default). A second server, on a port of its own and
//! without auth, answers `stub_status` (its count of open connections).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use sha1::{Digest, Sha1};

use rustls_pki_types::CertificateDer;

use crate::load::Target;
use crate::proxy_process::{free_port, http_get, write_certificate, ScratchDir};

pub struct NginxProcess {
    pub addr: SocketAddr,
    /// Where `stub_status` answers.
    status: SocketAddr,
    /// Its certificate, when it serves TLS.
    certificate: Option<CertificateDer<'static>>,
    child: Child,
    /// Held for its removal, after the child is stopped.
    _dir: ScratchDir,
}

impl Drop for NginxProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `user-<i>:{SHA}base64(sha1("pw-<i>"))`: the credentials of
/// [`crate::proxy_process::tenants_file`], as nginx's htpasswd reads them.
pub fn htpasswd(users: usize) -> String {
    (0..users)
        .map(|i| {
            let digest = Sha1::digest(format!("pw-{i}").as_bytes());
            let encoded = base64::engine::general_purpose::STANDARD.encode(digest);
            format!("user-{i}:{{SHA}}{encoded}\n")
        })
        .collect()
}

/// The gateway's configuration: every user mapped to its tenant.
pub fn config(
    dir: &std::path::Path,
    listen: SocketAddr,
    status: SocketAddr,
    upstream: SocketAddr,
    users: usize,
    access_log: bool,
    https: bool,
) -> String {
    let tenants: String = (0..users)
        .map(|i| format!("    user-{i} tenant-{i};\n"))
        .collect();
    let log = if access_log {
        format!("access_log {}/access.log main;", dir.display())
    } else {
        "access_log off;".into()
    };
    let d = dir.display();
    let listen_directives = match https {
        false => format!("listen {listen};"),
        true => format!(
            "listen {listen} ssl http2;\n\
             ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem;\n\
             ssl_protocols TLSv1.2 TLSv1.3;"
        ),
    };
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
           client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;\n\
           uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           log_format main '$remote_addr - $remote_user [$time_local] \"$request\" $status $body_bytes_sent $request_time';\n\
           {log}\n\
           keepalive_requests 100000000; keepalive_timeout 300s;\n\
           map $remote_user $tenant {{\n    default \"\";\n{tenants}  }}\n\
           upstream backend {{ server {upstream}; keepalive 64; }}\n\
           server {{\n\
             {listen_directives}\n\
             auth_basic \"tenant\";\n\
             auth_basic_user_file {d}/htpasswd;\n\
             location / {{\n\
               proxy_pass http://backend;\n\
               proxy_http_version 1.1;\n\
               proxy_set_header Connection \"\";\n\
               proxy_set_header Authorization \"\";\n\
               proxy_set_header X-Scope-OrgID $tenant;\n\
             }}\n\
           }}\n\
           server {{ listen {status}; access_log off; location = /status {{ stub_status; }} }}\n\
         }}\n"
    )
}

impl NginxProcess {
    pub async fn start(
        upstream: SocketAddr,
        users: usize,
        access_log: bool,
        https: bool,
    ) -> anyhow::Result<Self> {
        let scratch = ScratchDir::new("loadtest-nginx")?;
        let dir = scratch.path();
        let (addr, status) = (free_port(), free_port());
        std::fs::write(dir.join("htpasswd"), htpasswd(users))?;
        let certificate = https.then(|| write_certificate(dir)).transpose()?;
        std::fs::write(
            dir.join("nginx.conf"),
            config(dir, addr, status, upstream, users, access_log, https),
        )?;
        let child = Command::new("nginx")
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting nginx: {e} (Debian package `nginx`)"))?;
        let process = Self {
            addr,
            status,
            certificate,
            child,
            _dir: scratch,
        };
        // nginx gives no readiness signal but its socket.
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            anyhow::ensure!(Instant::now() < deadline, "nginx did not listen on {addr}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(process)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Client connections open, the one asking excepted (`stub_status`'s
    /// "Active connections" counts it).
    pub async fn open_connections(&self) -> anyhow::Result<f64> {
        let reply = http_get(self.status, "/status").await?;
        let active: f64 = reply
            .lines()
            .find_map(|line| line.strip_prefix("Active connections:"))
            .and_then(|count| count.trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no connection count in nginx's stub_status"))?;
        Ok(active - 1.0)
    }

    /// Where clients reach it, and how.
    pub fn target(&self) -> anyhow::Result<Target> {
        Target::of_gateway(self.addr, self.certificate.as_ref())
    }
}
