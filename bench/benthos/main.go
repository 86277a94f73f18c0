// The Benthos baseline of scripts/bench.sh: Benthos v4.27.0 as its users
// build it, with only the components the benchmark's pipelines use (MQTT
// in, dedupe over a memory or Redis cache, Pulsar out). Built from the Go
// module proxy by bench.sh; nothing of Benthos is kept in this repository.
package main

import (
	"context"

	"github.com/benthosdev/benthos/v4/public/service"

	_ "github.com/benthosdev/benthos/v4/public/components/io"
	_ "github.com/benthosdev/benthos/v4/public/components/mqtt"
	_ "github.com/benthosdev/benthos/v4/public/components/pulsar"
	_ "github.com/benthosdev/benthos/v4/public/components/pure"
	_ "github.com/benthosdev/benthos/v4/public/components/redis"
)

func main() {
	service.RunCLI(context.Background())
}
