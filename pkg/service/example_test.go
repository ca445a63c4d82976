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
	// Usage: demo [--help]
	//
	// Configuration, from environment variables:
	//
	//   VARIABLE     DEFAULT     DESCRIPTION
	//   ADDR         :8080       listen address
	//   TOKEN        (required)  API token (secret)
	//   DEMO_DB_URL  -           database URL
}

// Example shows the shape of a service's main: one exit point, run taking
// its environment as arguments, the first signal draining, the second
// exiting at once.
func Example() {
	run := func(ctx context.Context, args []string, getenv func(string) string) error {
		cfg := &service.Common{AdminAddr: "127.0.0.1:9100"}
		if err := service.ParseArgs(args, os.Stdout, "demo", "serves demos", cfg); err != nil {
			return err
		}
		if err := service.Load(getenv, cfg); err != nil {
			return err
		}
		logger, err := service.NewLogger(os.Stderr, cfg.LogLevel, cfg.LogFormat)
		if err != nil {
			return err
		}
		logger = logger.With().Str("service", "demo").Logger()
		service.LogConfig(logger, cfg)
		admin, err := service.NewAdmin(service.AdminConfig{Addr: cfg.AdminAddr, Logger: logger})
		if err != nil {
			return err
		}
		admin.MarkReady()
		return service.RunComponents(ctx, logger, cfg.ShutdownGrace, admin.Component())
	}
	main := func() {
		ctx, stop := service.WithShutdownSignals(context.Background(), nil)
		err := run(ctx, os.Args[1:], os.Getenv)
		stop()
		if service.ExitCode(err) != 0 {
			fmt.Fprintln(os.Stderr, "demo:", err)
		}
		os.Exit(service.ExitCode(err))
	}
	_ = main // a real main calls it
}
