package framework

import (
	"fmt"
	"os"
	"strings"
)

// ChartMallocTunables reads mallocTunables (serve's GLIBC_TUNABLES) from the chart's
// values.yaml, so that a benchmark or soak runs serve with the allocator settings it has in a
// cluster.
func ChartMallocTunables(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "mallocTunables: "); ok {
			return strings.Trim(v, `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no mallocTunables", path)
}

// FreePort asks the kernel for an unused loopback TCP port (see freePort).
func FreePort() (int, error) { return freePort() }
