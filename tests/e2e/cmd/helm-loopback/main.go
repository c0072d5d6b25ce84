// Command helm-loopback is a Helm post-renderer for the e2e suite: it passes
// the chart's rendered manifests through unchanged, except each
// ValidatingWebhookConfiguration webhook's clientConfig, which becomes
// `url: <-url>` with the caBundle read from <-ca-file> (framework.Loopback,
// the same rewrite the suite applies to deploy/base). The suite runs the
// webhook as a local process, and the API server has no route to a Service.
//
//	helm install ... --post-renderer helm-loopback \
//	  --post-renderer-args=-url=https://127.0.0.1:PORT/validate --post-renderer-args=-ca-file=ca.crt
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"gpu-deploy-guard/tests/e2e/framework"
)

func main() {
	url := flag.String("url", "", "webhook URL for every clientConfig")
	caFile := flag.String("ca-file", "", "PEM CA bundle the API server must trust")
	flag.Parse()
	if err := run(*url, *caFile, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "helm-loopback:", err)
		os.Exit(1)
	}
}

func run(url, caFile string, in io.Reader, out io.Writer) error {
	if url == "" || caFile == "" {
		return fmt.Errorf("-url and -ca-file are required")
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	objs, err := framework.SplitManifests(data)
	if err != nil {
		return err
	}
	rewritten := 0
	for _, o := range objs {
		doc := o.YAML
		if o.Kind == "ValidatingWebhookConfiguration" {
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			if err := yaml.UnmarshalStrict(o.YAML, &vwc); err != nil {
				return fmt.Errorf("ValidatingWebhookConfiguration %s: %w", o.Name, err)
			}
			lb, err := framework.Loopback(&vwc, url, ca)
			if err != nil {
				return err
			}
			if doc, err = yaml.Marshal(lb); err != nil {
				return err
			}
			rewritten++
		}
		if _, err := fmt.Fprintf(out, "---\n%s\n", doc); err != nil {
			return err
		}
	}
	if rewritten != 1 {
		return fmt.Errorf("want exactly one ValidatingWebhookConfiguration in the chart's output, found %d", rewritten)
	}
	return nil
}
