//! The broker's side of MCP over a copy's stdio (newline-delimited JSON-RPC 2.0), with
//! bounded message sizes. Messages from a copy are hostile input: parsed once, sizes
//! checked, anything unexpected ignored or answered with an error.

use std::io::{BufRead, Write};

use serde_json::{json, Value};

use crate::ExecutorError;

/// The protocol version the broker offers.
pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// Lines that are not JSON objects skipped before one message, at most.
const MAX_SKIPPED_LINES: usize = 1000;

/// An MCP client over a line-oriented byte stream.
pub struct McpClient<R, W> {
    reader: R,
    writer: W,
    next_id: u64,
    max_message: usize,
    /// The last lines of the server's stderr, if the tool host sent them
    /// (`notifications/germline/stderr`, when the server failed).
    stderr_tail: Option<String>,
    /// Control lines not acknowledged, written with the next message in one write (a
    /// pooled copy is woken once for a call, not once per line).
    pending: Vec<u8>,
}

/// Characters of a server's stderr kept for an error, at most.
const STDERR_TAIL_CHARS: usize = 4096;

impl<R: BufRead, W: Write> McpClient<R, W> {
    /// Wraps a reader and writer.
    pub fn new(reader: R, writer: W, max_message: usize) -> Self {
        McpClient { reader, writer, next_id: 1, max_message, stderr_tail: None, pending: Vec::new() }
    }

    /// `initialize` then `notifications/initialized`; returns the server's result.
    pub fn initialize(&mut self) -> Result<Value, ExecutorError> {
        let result = self.request(
            "initialize",
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "germline-broker", "version": env!("CARGO_PKG_VERSION")}
            }),
        )?;
        let result = result.map_err(|e| ExecutorError::Copy(format!("initialize failed: {e}")))?;
        self.notify("notifications/initialized", json!({}))?;
        Ok(result)
    }

    /// Sends a request and waits for its response: `Ok(Ok(result))` or `Ok(Err(error))`
    /// for a JSON-RPC error object.
    pub fn request(&mut self, method: &str, params: Value) -> Result<Result<Value, Value>, ExecutorError> {
        let id = self.send_request(method, params)?;
        self.response(id)
    }

    /// Sends a request; returns its id for [`McpClient::response`].
    pub fn send_request(&mut self, method: &str, params: Value) -> Result<u64, ExecutorError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        Ok(id)
    }

    /// Blocks until the server has sent at least one byte (or closed the stream).
    pub fn wait_readable(&mut self) -> Result<(), ExecutorError> {
        fill(&mut self.reader).map(|_| ())
    }

    /// Waits for the response to request `id`, answering the server's own requests.
    pub fn response(&mut self, id: u64) -> Result<Result<Value, Value>, ExecutorError> {
        loop {
            let msg = match self.read_message() {
                Ok(m) => m,
                Err(e) => {
                    return Err(match self.stderr_tail.take() {
                        Some(tail) => {
                            let why = match e {
                                ExecutorError::Copy(why) => why,
                                other => other.to_string(),
                            };
                            ExecutorError::Copy(format!("{why}; its stderr ended with:\n{tail}"))
                        }
                        None => e,
                    })
                }
            };
            if msg.get("method").and_then(Value::as_str) == Some("notifications/germline/stderr")
                && msg.get("id").is_none()
            {
                let text = msg["params"]["text"].as_str().unwrap_or_default();
                let skip = text.chars().count().saturating_sub(STDERR_TAIL_CHARS);
                self.stderr_tail = Some(text.chars().skip(skip).collect());
                continue;
            }
            if msg.get("method").is_some() {
                if let Some(req_id) = msg.get("id") {
                    // A request from the server (ping, sampling, roots...): the broker
                    // answers ping and refuses the rest; nothing flows to the agent.
                    let reply = if msg["method"] == "ping" {
                        json!({"jsonrpc": "2.0", "id": req_id, "result": {}})
                    } else {
                        json!({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": "not supported by germline"}})
                    };
                    self.send(&reply)?;
                }
                continue;
            }
            if msg.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(err) = msg.get("error") {
                    return Ok(Err(err.clone()));
                }
                return Ok(Ok(msg.get("result").cloned().unwrap_or(Value::Null)));
            }
        }
    }

    /// Sends one of the broker's control lines to a pooled copy's tool host (see the
    /// host's `_PooledStdin`); with `ack`, waits for its `{"germline":"ready"}` (skipping
    /// what the server sends meanwhile, as [`McpClient::response`] does). Without, the
    /// line goes out with the next message, in the same write and before it.
    pub fn control(&mut self, msg: &Value, ack: bool) -> Result<(), ExecutorError> {
        // The copy tells a control line by its start, `{"germline"`: its other keys sort
        // after that one (a JSON object here is written in key order).
        if msg.as_object().and_then(|m| m.keys().next()).map(String::as_str) != Some("germline") {
            return Err(ExecutorError::internal("a control line must start with its germline key"));
        }
        if !ack {
            serde_json::to_writer(&mut self.pending, msg).map_err(|e| ExecutorError::Copy(e.to_string()))?;
            self.pending.push(b'\n');
            return Ok(());
        }
        self.send(msg)?;
        for _ in 0..MAX_SKIPPED_LINES {
            let msg = self.read_message()?;
            if msg.get("germline").and_then(Value::as_str) == Some("ready") {
                return Ok(());
            }
            if msg.get("method").and_then(Value::as_str) == Some("notifications/germline/stderr") {
                let text = msg["params"]["text"].as_str().unwrap_or_default();
                let skip = text.chars().count().saturating_sub(STDERR_TAIL_CHARS);
                let tail: String = text.chars().skip(skip).collect();
                return Err(ExecutorError::Copy(format!("the copy failed; its stderr ended with:\n{tail}")));
            }
        }
        Err(ExecutorError::Copy("the copy did not take its twin inputs".into()))
    }

    /// Sends a notification.
    pub fn notify(&mut self, method: &str, params: Value) -> Result<(), ExecutorError> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    fn send(&mut self, msg: &Value) -> Result<(), ExecutorError> {
        let mut line = std::mem::take(&mut self.pending);
        serde_json::to_writer(&mut line, msg).map_err(|e| ExecutorError::Copy(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line).map_err(ExecutorError::io("writing to the copy"))?;
        self.writer.flush().map_err(ExecutorError::io("writing to the copy"))
    }

    fn read_message(&mut self) -> Result<Value, ExecutorError> {
        let mut skipped = 0;
        loop {
            let line = read_line_bounded(&mut self.reader, self.max_message)?;
            let trimmed = line.trim_ascii();
            if trimmed.is_empty() {
                continue;
            }
            // A line that is not JSON (a server's stray print on stdout) is dropped, as
            // the MCP SDK's clients do; a bounded number of them per message.
            if !trimmed.starts_with(b"{") && skipped < MAX_SKIPPED_LINES {
                skipped += 1;
                continue;
            }
            return serde_json::from_slice(trimmed)
                .map_err(|e| ExecutorError::Copy(format!("copy sent malformed JSON-RPC: {e}")));
        }
    }
}

/// The reader's buffer, filled if empty. A read interrupted by a signal the broker ignores
/// is read again (a blocking read with a timeout is not restarted by the kernel); the
/// channel's deadline still bounds it.
fn fill(r: &mut impl BufRead) -> Result<&[u8], ExecutorError> {
    loop {
        match r.fill_buf() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ExecutorError::io("reading from the copy")(e)),
            // Filled (or at its end): asking again reads nothing more.
            Ok(_) => return r.fill_buf().map_err(ExecutorError::io("reading from the copy")),
        }
    }
}

/// Reads one `\n`-terminated line of at most `max` bytes.
pub fn read_line_bounded(r: &mut impl BufRead, max: usize) -> Result<Vec<u8>, ExecutorError> {
    let mut out = Vec::new();
    loop {
        let buf = fill(r)?;
        if buf.is_empty() {
            return Err(ExecutorError::Copy("the copy closed its channel".into()));
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        out.extend_from_slice(&buf[..take]);
        r.consume(take);
        if out.len() > max {
            return Err(ExecutorError::Copy(format!("message over {max} bytes")));
        }
        if done {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_pings_skips_notifications_and_bounds_lines() {
        let server = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n{\"jsonrpc\":\"2.0\",\"id\":\"s1\",\"method\":\"ping\"}\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"ok\":true}}\n";
        let mut sent = Vec::new();
        let mut c = McpClient::new(&server[..], &mut sent, 1 << 20);
        let r = c.request("tools/list", json!({})).unwrap().unwrap();
        assert_eq!(r["ok"], true);
        let sent = String::from_utf8(sent).unwrap();
        assert!(sent.contains("\"id\":\"s1\"") && sent.contains("\"result\":{}"), "{sent}");
        let long = [b'x'; 100];
        assert!(read_line_bounded(&mut &long[..], 10).is_err());
    }

    /// Records each write as one entry.
    struct Writes(Vec<Vec<u8>>);

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn unacknowledged_control_lines_go_out_before_the_next_message_in_one_write() {
        let mut w = Writes(Vec::new());
        let mut c = McpClient::new(&b""[..], &mut w, 1 << 20);
        c.control(&json!({"germline": "twin", "reply": false}), false).unwrap();
        c.control(&json!({"germline": "data"}), false).unwrap();
        assert!(c.control(&json!({"data": 1, "zz": "germline"}), false).is_err(), "key order checked");
        c.send_request("tools/call", json!({})).unwrap();
        drop(c);
        assert_eq!(w.0.len(), 1, "one write");
        let text = String::from_utf8(w.0.concat()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("{\"germline\":\"twin\"") && lines[1] == "{\"germline\":\"data\"}", "{text}");
        assert!(lines[2].contains("\"method\":\"tools/call\""), "{text}");
    }

    #[test]
    fn stray_lines_that_are_not_json_are_dropped_as_the_sdk_clients_do() {
        let server = b"Starting the server...\nServer running on stdio\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"ok\":true}}\n";
        let mut sent = Vec::new();
        let mut c = McpClient::new(&server[..], &mut sent, 1 << 20);
        assert_eq!(c.request("tools/list", json!({})).unwrap().unwrap()["ok"], true);
        let many = "x\n".repeat(MAX_SKIPPED_LINES + 1);
        let mut c = McpClient::new(many.as_bytes(), Vec::new(), 1 << 20);
        assert!(c.request("tools/list", json!({})).is_err(), "bounded");
    }
}
