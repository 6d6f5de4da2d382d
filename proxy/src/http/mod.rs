//! What speaks HTTP to tenants' clients: the listener and its TLS, request
//! paths, the client's address, identity headers, bodies and their limits,
//! WebSocket framing, and the one place that turns every failure into a
//! status and a body.

pub mod address_slots;
pub mod address_text;
pub mod body;
pub mod client_address;
pub mod connection;
pub mod error;
pub mod headers;
pub mod large_bodies;
pub mod path;
pub mod protocol;
pub mod receive_buffer;
pub mod server;
pub mod timer;
pub mod tls;
pub mod unsent;
pub mod websocket;
