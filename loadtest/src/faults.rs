//! A relay in front of the sink that misbehaves on command, for fault
//! drills under load: it refuses connections, resets them in the middle of
//! a response head or body, or stalls, and every switch drops the
//! connections it holds, so the proxy's pooled connections see the fault at
//! once. Loopback only, like everything in the load generator.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Relays to the backend.
    Healthy,
    /// Nothing listens: connections are refused.
    Refuse,
    /// Half a response head, then a reset.
    ResetInHead,
    /// A whole 200 head, half the body, then a reset.
    ResetInBody,
    /// Reads the request and never answers.
    Stall,
}

impl Fault {
    /// The drill's row name.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Healthy => "faults: healthy",
            Fault::Refuse => "faults: refused",
            Fault::ResetInHead => "faults: reset in head",
            Fault::ResetInBody => "faults: reset in body",
            Fault::Stall => "faults: stall",
        }
    }
}

pub struct FaultyUpstream {
    pub addr: SocketAddr,
    mode: watch::Sender<Fault>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultyUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultyUpstream {
    pub async fn start(backend: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Fault::Healthy);
        let task = tokio::spawn(serve(listener, addr, backend, mode.clone()));
        Ok(Self { addr, mode, task })
    }

    /// Switches the fault; connections opened before are dropped.
    pub fn set(&self, fault: Fault) {
        self.mode.send_replace(fault);
    }
}

async fn serve(
    mut listener: TcpListener,
    addr: SocketAddr,
    backend: SocketAddr,
    mode: watch::Sender<Fault>,
) {
    let mut changes = mode.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let fault = *changes.borrow();
                tokio::spawn(connection(stream, backend, fault, mode.subscribe()));
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                if *changes.borrow_and_update() == Fault::Refuse {
                    drop(listener);
                    // Listen again (same port: SO_REUSEADDR) once the fault ends.
                    if changes.wait_for(|f| *f != Fault::Refuse).await.is_err() {
                        return;
                    }
                    listener = match TcpListener::bind(addr).await {
                        Ok(listener) => listener,
                        Err(e) => {
                            eprintln!("fault relay: cannot listen on {addr} again: {e}");
                            return;
                        }
                    };
                }
            }
        }
    }
}

/// One client connection, handled as the fault at accept time says, and
/// dropped as soon as the fault changes.
async fn connection(
    mut client: TcpStream,
    backend: SocketAddr,
    fault: Fault,
    mut changes: watch::Receiver<Fault>,
) {
    changes.mark_unchanged();
    let work = async {
        match fault {
            Fault::Healthy => {
                let Ok(mut upstream) = TcpStream::connect(backend).await else {
                    return;
                };
                // Passed on as it comes, as the proxy and the sink send it:
                // with Nagle's algorithm here, a request whose body the
                // proxy sent after its head (a streamed push whose body came
                // later in a client's HTTP/2 frames) waited for the sink's
                // delayed ACK, 40 ms, which the relay, not the proxy, added.
                let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
            Fault::Refuse => {}
            Fault::ResetInHead | Fault::ResetInBody => {
                let mut request = vec![0; 64 * 1024];
                let _ = client.read(&mut request).await;
                let partial: &[u8] = if fault == Fault::ResetInHead {
                    b"HTTP/1.1 200 OK\r\nContent-Le"
                } else {
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"status\":"
                };
                let _ = client.write_all(partial).await;
                // A reset (RST), not an orderly close.
                let _ = client.set_zero_linger();
            }
            Fault::Stall => {
                let mut request = vec![0; 64 * 1024];
                let _ = client.read(&mut request).await;
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = work => {}
        _ = changes.changed() => {}
        // A bound even if nobody switches the fault again.
        _ = tokio::time::sleep(Duration::from_secs(600)) => {}
    }
}
