//! How much the kernel keeps queued, unsent, for one of the proxy's
//! connections.
//!
//! A socket's send buffer grows with its connection's pace (Linux's
//! autotuning, up to `net.ipv4.tcp_wmem`'s maximum, 4 MiB by default). A
//! client that lets no answer through, or first takes answers quickly and
//! then stops, leaves that much queued in the kernel for its connection,
//! and needs no credential to do it: pipelined requests' 401s are answers
//! too. A memory cgroup v2 charges those buffers to the pod, beside the
//! proxy's own memory: 4,096 such connections could hold 16 GiB
//! (docs/operations.md, "Memory at worst"). A push towards an upstream
//! that stops reading waited there the same way, up to 4 MiB a request.
//!
//! `TCP_NOTSENT_LOWAT` bounds the bytes queued and not yet sent: a write
//! waits while that many are. Bytes sent leave the buffer once
//! acknowledged, which a receiver's kernel does as it buffers them, so a
//! reader that keeps up is not slowed (what is in flight is bounded by the
//! congestion window, not by this); one that stops reading leaves this
//! much, and the part of a write the kernel had already taken, on the
//! proxy's side. 16 KiB, as HTTP/2 servers commonly take to keep their
//! queues short: relaying an 8 MiB answer on loopback cost less CPU with
//! it than with none, and more with 64 or 256 KiB (docs/benchmarks.md,
//! "Answers a client does not read: the kernel's buffers").

use std::io;

use socket2::SockRef;
use tokio::net::TcpStream;

/// Unsent bytes a connection may have queued before a write waits.
pub const UNSENT_BYTES: u32 = 16 << 10;

/// Bounds the bytes `stream`'s kernel buffer holds unsent.
pub fn bound(stream: &TcpStream) -> io::Result<()> {
    SockRef::from(stream).set_tcp_notsent_lowat(UNSENT_BYTES)
}
