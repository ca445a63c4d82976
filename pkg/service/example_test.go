package service_test

import (
	"context"
	"fmt"
	"os"

	"github.com/autoprovisioner/autoprovisioner/pkg/service"
)

func ExampleLoad() {
	type Config struct {
		service.Common
		Workers int `env:"WORKERS" envDefault:"4" desc:"number of workers"`
	}
	// The service's own default for the shared ADMIN_ADDR goes in first.
	cfg := &Config{Common: service.Common{AdminAddr: "127.0.0.1:9102"}}
	environ := map[string]string{"WORKERS": "8", "LOG_LEVEL": "debug"}
	err := service.Load(func(k string) string { return environ[k] }, cfg)
	fmt.Println(err, cfg.Workers, cfg.LogLevel, cfg.AdminAddr, cfg.ShutdownGrace)

	environ = map[string]string{"WORKERS": "many", "LOG_LEVEL": "loud", "SHUTDOWN_GRACE": "0s"}
	err = service.Load(func(k string) string { return environ[k] }, cfg)
	fmt.Println(err)
	fmt.Println("exit status", service.ExitCode(err))
	// Output:
	// <nil> 8 debug 127.0.0.1:9102 30s
	// invalid configuration (3 problems):
	//   WORKERS: strconv.ParseInt: parsing "many": invalid syntax
	//   LOG_LEVEL: "loud" is not one of debug, info, warn, error
	//   SHUTDOWN_GRACE: must be positive, got 0s
	// exit status 2
}

func ExampleUsage() {
	type Config struct {
		Addr  string `env:"ADDR" envDefault:":8080" desc:"listen address"`
		Token string `env:"TOKEN,required" secret:"true" desc:"API token"`
		DB    struct {
			URL string `env:"URL" desc:"database URL"`
		} `envPrefix:"DEMO_DB_"`
	}
	service.Usage(os.Stdout, "demo", "serves demos", &Config{})
	// Output:
	// demo: serves demos
	//
	// Usage: demo [--help | --check-config | --check-secrets [--secret-refs FILE]]
	//
	//   --check-config   load and validate the configuration, start nothing, exit
	//   --check-secrets  also resolve every secret reference it names (one JSON line each, no values)
	//
	// Configuration, from environment variables:
	//
	//   VARIABLE     DEFAULT     DESCRIPTION
	//   ADDR         :8080       listen address
	//   TOKEN        (required)  API token (secret)
	//   DEMO_DB_URL  -           database URL
}

// Example shows the shape of a service: its configuration (a struct
// embedding Common, with the service's own defaults) and its components,
// in its internal/app package; its main only names them. Main handles the
// command line and the environment, serves until SIGINT/SIGTERM drains the
// service (a second signal exits at once), and exits with ExitCode.
func Example() {
	type Config struct {
		service.Common
		Greeting string `env:"GREETING" envDefault:"hello" desc:"what the worker says"`
	}
	newConfig := func() *Config {
		return &Config{Common: service.Common{AdminAddr: "127.0.0.1:9100"}}
	}
	components := func(_ context.Context, cfg *Config, d service.Deps) ([]service.Component, error) {
		worker := service.Component{Name: "worker", Run: func(ctx context.Context) error {
			d.Logger.Info().Msg(cfg.Greeting)
			<-ctx.Done()
			return nil
		}}
		return []service.Component{worker}, nil
	}
	main := func() {
		service.Main(service.Program[*Config]{
			Name:       "demo",
			Summary:    "serves demos",
			NewConfig:  newConfig,
			Components: components,
		})
	}
	_ = main // a real main is this function
}
