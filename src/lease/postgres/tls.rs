//! TLS for the PostgreSQL connections: rustls on ring (the provider the
//! DynamoDB client links already), behind tokio-postgres's TLS traits.
//!
//! `sslmode` decides what is verified, as libpq does: `prefer` and
//! `require` encrypt without checking who the server is; `verify-ca`
//! checks that its certificate chains to a trusted CA (`store.ca_file` or
//! the URL's `sslrootcert`, else the system's roots); `verify-full` also
//! that it names the host of the URL. In every mode the handshake's
//! signatures are checked against the certificate the server presents.
//! No channel binding: SCRAM authenticates without it (`channel_binding`
//! stays `prefer`).

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use super::spec::SslMode;
use crate::text;

/// What makes a TLS session for each connection (cheap to clone).
#[derive(Clone)]
pub struct Tls {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// The TLS settings for `mode`, trusting the CA certificates in
    /// `ca_file` (PEM) or else the system's. Unverified modes load no
    /// roots. An error is one line naming the file or the problem.
    pub fn new(mode: SslMode, ca_file: Option<&Path>) -> Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = if mode.verifies() {
            Some(Arc::new(roots(ca_file)?))
        } else {
            None
        };
        let verifier = Verifier {
            mode,
            roots,
            algorithms: provider.signature_verification_algorithms,
        };
        let config = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot set up TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        Ok(Tls {
            config: Arc::new(config),
        })
    }
}

/// The CA certificates of `ca_file`, or the system's.
fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let shown = text::echo_plain(&path.display().to_string());
            let pem =
                std::fs::read(path).map_err(|e| format!("cannot read the CA file {shown}: {e}"))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert =
                    cert.map_err(|e| format!("the CA file {shown} is not valid PEM: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("the CA file {shown} holds a bad certificate: {e}"))?;
            }
            if roots.is_empty() {
                return Err(format!("the CA file {shown} holds no PEM certificate"));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(
                    "no system root certificates found to verify the PostgreSQL server with; set store.ca_file (or sslrootcert in store.url) to its CA's certificate".into(),
                );
            }
        }
    }
    Ok(roots)
}

/// Checks the server's certificate as `sslmode` says.
#[derive(Debug)]
struct Verifier {
    mode: SslMode,
    /// Present for the verifying modes.
    roots: Option<Arc<RootCertStore>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(roots) = &self.roots else {
            // prefer, require: encrypted, whoever the server is.
            return Ok(ServerCertVerified::assertion());
        };
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        if self.mode == SslMode::VerifyFull {
            verify_server_name(&cert, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl<S> MakeTlsConnect<S> for Tls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connect, io::Error> {
        let name = ServerName::try_from(domain.to_owned()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "`{}` is not a host name TLS can verify",
                    text::echo_plain(domain)
                ),
            )
        })?;
        Ok(Connect {
            config: self.config.clone(),
            name,
        })
    }
}

/// One connection's handshake.
pub struct Connect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move {
            connector
                .connect(self.name, stream)
                .await
                .map(|s| TlsStream(Box::new(s)))
        })
    }
}

/// A connection's TLS stream (boxed: a rustls session is large, and the
/// stream lives in the connection's task).
pub struct TlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for TlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
