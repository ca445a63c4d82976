package time4vps_test

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps"
	"github.com/autoprovisioner/autoprovisioner/pkg/time4vps/time4vpstest"
)

// Reinstall a server as the infra service does for force_reinstall: refresh
// the details, check the OS, reinstall, wait for the task, read the result.
func Example() {
	api := time4vpstest.New(time4vpstest.Config{})
	defer api.Close()
	api.AddServer(time4vpstest.VPS{ID: 42, Domain: "web.example.net", IP: "192.0.2.10", OS: "kvm-debian-12-x86_64"})

	client, err := time4vps.New(time4vps.Config{
		URL:              api.URL(),
		Username:         api.Username(),
		Password:         time4vps.Secret(api.Password()),
		TaskPollInterval: 10 * time.Millisecond,
	}, zerolog.Nop())
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const osName = "kvm-ubuntu-24.04-gpt-x86_64"
	if err := client.CheckOS(ctx, 42, osName); err != nil {
		fmt.Println(err)
		return
	}
	taskID, err := client.Reinstall(ctx, 42, time4vps.ReinstallRequest{OS: osName, SSHKey: "ssh-ed25519 AAAAC3Nza deploy"})
	if err != nil {
		fmt.Println(err) // on ErrOutcomeUnknown, read the server's ActiveTask before trying again
		return
	}
	task, err := client.WaitTask(ctx, 42, taskID)
	if err != nil {
		fmt.Println(err)
		return
	}
	server, err := client.Server(ctx, 42)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(task.Name, task.State(), server.OS, server.Addresses())
	// Output: server_recreate completed kvm-ubuntu-24.04-gpt-x86_64 [192.0.2.10]
}
