//! The drill's HTTP client (hyper, one connection per attempt): a request to a
//! replica or the router, and a `/readyz` check. What came back is said in the
//! drill's words (`committed`, `rejected_drainit`, `reset`, `short_body`…); it
//! never retries by itself.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// `GET /readyz` on a probe port: whether it answered 200 (within `timeout`).
pub(super) async fn readyz(port: u16, timeout: Duration) -> bool {
    let probe = async {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(conn);
        let req = hyper::Request::get("/readyz")
            .header(hyper::header::HOST, format!("127.0.0.1:{port}"))
            .header(hyper::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .ok()?;
        let resp = tx.send_request(req).await.ok()?;
        let ok = resp.status() == hyper::StatusCode::OK;
        let _ = resp.into_body().collect().await;
        Some(ok)
    };
    matches!(tokio::time::timeout(timeout, probe).await, Ok(Some(true)))
}

/// Sends one attempt to `port` and says what came back.
pub(super) async fn attempt(
    port: u16,
    path: &str,
    rid: &str,
    timeout: Duration,
) -> (String, Option<u16>, u64, Option<f64>) {
    let run = async {
        let stream = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => s,
            Err(_) => return ("refused".to_string(), None, 0, None),
        };
        let Ok((mut tx, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            return ("reset".into(), None, 0, None);
        };
        tokio::spawn(conn);
        let Ok(req) = hyper::Request::get(path)
            .header(hyper::header::HOST, format!("127.0.0.1:{port}"))
            .header("x-request-id", rid)
            .body(Empty::<Bytes>::new())
        else {
            return ("reset".into(), None, 0, None);
        };
        let resp = match tx.send_request(req).await {
            Ok(r) => r,
            Err(_) => return ("reset".into(), None, 0, None),
        };
        let status = resp.status().as_u16();
        let by_drainit = resp
            .headers()
            .get_all("proxy-status")
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.contains("drainit")));
        let retry_after = resp
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok());
        let mut body = resp.into_body();
        let mut bytes = 0u64;
        loop {
            match body.frame().await {
                None => break,
                Some(Ok(f)) => bytes += f.data_ref().map_or(0, |d| d.len() as u64),
                Some(Err(_)) => return ("short_body".into(), Some(status), bytes, None),
            }
        }
        let outcome = match status {
            503 if by_drainit => "rejected_drainit",
            502 | 504 => "bad_gateway",
            500..=599 => "app_5xx",
            _ => "committed",
        };
        (outcome.into(), Some(status), bytes, retry_after)
    };
    tokio::time::timeout(timeout, run)
        .await
        .unwrap_or_else(|_| ("timeout".into(), None, 0, None))
}
