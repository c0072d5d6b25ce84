//! The floor: the least any TLS webhook has to do per review. It terminates TLS like
//! gpu-deploy-guard (rustls with ring, TLS 1.2 and 1.3, ALPN h2 and http/1.1, the same
//! certificate), serves HTTP/1.1 and HTTP/2 with hyper on a multi-threaded tokio runtime, reads
//! the whole AdmissionReview to find `request.uid`, and answers `allowed: true`. No routing, no
//! limits, no policy, no metrics, no logs.
//!
//! `bench/run.sh` loads it and gpu-deploy-guard with the same requests and reports our
//! throughput as a share of this one's. It is a `[[bench]]` only so that it lives under
//! `benches/` and is built with the bench profile; run without `--serve` (as plain `cargo bench`
//! does) it prints how to use it and exits.
//!
//! ```text
//! floor_server --serve 127.0.0.1:8444 --tls-cert tls.crt --tls-key tls.key
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

struct Args {
    listen: SocketAddr,
    cert: PathBuf,
    key: PathBuf,
}

fn args() -> Result<Option<Args>, String> {
    let mut listen = None;
    let mut cert = None;
    let mut key = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--serve" => {
                let text = value("--serve")?;
                listen = Some(text.parse().map_err(|e| format!("--serve {text}: {e}"))?);
            }
            "--tls-cert" => cert = Some(PathBuf::from(value("--tls-cert")?)),
            "--tls-key" => key = Some(PathBuf::from(value("--tls-key")?)),
            // What `cargo bench` passes to every bench binary.
            _ => {}
        }
    }
    match (listen, cert, key) {
        (None, _, _) => Ok(None),
        (Some(listen), Some(cert), Some(key)) => Ok(Some(Args { listen, cert, key })),
        _ => Err("--serve needs --tls-cert and --tls-key".to_owned()),
    }
}

fn tls_config(args: &Args) -> Result<Arc<ServerConfig>, String> {
    let chain = CertificateDer::pem_file_iter(&args.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", args.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&args.key)
        .map_err(|e| format!("{}: {e}", args.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[derive(serde::Deserialize)]
struct Review {
    request: Uid,
}

#[derive(serde::Deserialize)]
struct Uid {
    uid: String,
}

#[derive(serde::Serialize)]
struct Answer<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    response: Allowed<'a>,
}

#[derive(serde::Serialize)]
struct Allowed<'a> {
    uid: &'a str,
    allowed: bool,
}

async fn review(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return Ok(plain(StatusCode::BAD_REQUEST)),
    };
    let Ok(review) = serde_json::from_slice::<Review>(&body) else {
        return Ok(plain(StatusCode::BAD_REQUEST));
    };
    let answer = Answer {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        response: Allowed {
            uid: &review.request.uid,
            allowed: true,
        },
    };
    let bytes = serde_json::to_vec(&answer).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn plain(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::default());
    *response.status_mut() = status;
    response
}

async fn serve(args: Args, config: Arc<ServerConfig>) -> std::io::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    println!("floor server listening on {}", listener.local_addr()?);
    let acceptor = TlsAcceptor::from(config);
    let builder = auto::Builder::new(TokioExecutor::new());
    let h1 = Arc::new(builder.clone().http1_only());
    let h2 = Arc::new(builder.http2_only());
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let (acceptor, h1, h2) = (acceptor.clone(), h1.clone(), h2.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let builder = if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                h2
            } else {
                h1
            };
            let service = hyper::service::service_fn(review);
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(Some(args)) => args,
        Ok(None) => {
            eprintln!(
                "floor_server: reference server for bench/run.sh; \
                 run with --serve ADDR --tls-cert FILE --tls-key FILE"
            );
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("floor_server: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let config = match tls_config(&args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("floor_server: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(serve(args, config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor_server: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
