//! `gpu-deploy-guard certs`: a CA and a serving certificate for the webhook, written to a
//! directory, and the caBundle printed.

use std::net::IpAddr;
use std::path::PathBuf;

use crate::certs;

#[derive(clap::Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into (created when missing).
    #[arg(long)]
    pub out: PathBuf,
    /// DNS name of the webhook Service, e.g. gpu-deploy-guard.gpu-deploy-guard.svc; repeatable.
    #[arg(long = "dns", num_args = 1..)]
    pub dns: Vec<String>,
    /// IP address to put in the certificate; repeatable.
    #[arg(long = "ip", num_args = 1..)]
    pub ips: Vec<IpAddr>,
    /// Days the certificates stay valid.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// Overwrite existing files.
    #[arg(long)]
    pub force: bool,
}

/// Runs `certs`: writes the files and prints the caBundle.
pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    if args.dns.is_empty() && args.ips.is_empty() {
        anyhow::bail!("give at least one --dns NAME or --ip IP for the certificate");
    }
    let bundle = certs::generate(&args.dns, &args.ips, args.days)?;
    certs::write_dir(&args.out, &bundle, args.force)?;
    eprintln!(
        "wrote {0}/ca.crt, {0}/tls.crt and {0}/tls.key; the caBundle for the webhook configuration:",
        args.out.display()
    );
    println!("{}", certs::ca_bundle_base64(&bundle));
    Ok(())
}
