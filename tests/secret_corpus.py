"""The redaction corpus of issue 22 §8: secret shapes as they turn up in prompts, commands, tool output and
questions, each with the secret a redacted text must not hold; and text that must pass intact (metric names,
numbers, hashes, ordinary prose). Used by tests/test_redaction.py. Every value is made up: well-formed,
never issued."""

from __future__ import annotations

# (shape, text that holds the secret, the secret itself)
SECRETS: list[tuple[str, str, str]] = [
    (
        "anthropic",
        "ANTHROPIC key sk-ant-api03-Zq8xW2vN7pL4mK9jH3gF6dS1aQ0eR5tY in the env",
        "Zq8xW2vN7pL4mK9jH3gF6dS1aQ0eR5tY",
    ),
    (
        "openai project",
        "client = OpenAI(api_key=sk-proj-4fGh7JkL9mNpQ2rStUvWx3YzAb5CdEf)",
        "4fGh7JkL9mNpQ2rStUvWx3YzAb5CdEf",
    ),
    (
        "openai legacy",
        "use sk-8Hq2Lm5Nz7Wx4Rt9Ky3Pv6Bc1Df0Gj2Hk5Lm8Np for now",
        "8Hq2Lm5Nz7Wx4Rt9Ky3Pv6Bc1Df0Gj2Hk5Lm8Np",
    ),
    (
        "hugging face",
        "huggingface-cli login --token hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456",
        "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456",
    ),
    (
        "github classic",
        "git clone https://ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8@github.com/o/r",
        "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    ),
    (
        "github fine-grained",
        "GH=github_pat_11ABCDEFG0123456789_abcdefghijKLMNOPqrstuv",
        "github_pat_11ABCDEFG0123456789_abcdefghijKLMNOPqrstuv",
    ),
    ("aws access key id", "aws configure set aws_access_key_id AKIAZ7Q3M5N8P2R4T6V9", "AKIAZ7Q3M5N8P2R4T6V9"),
    (
        "aws secret, labelled",
        "aws_secret_access_key = Zk3Pq8Rt2Vw5Xy7Ab1Cd4Ef6Gh9Jk0Lm3Np5Qr8St",
        "Zk3Pq8Rt2Vw5Xy7Ab1Cd4Ef6Gh9Jk0Lm3Np5Qr8St",
    ),
    (
        "aws secret, unlabelled",
        "creds: AKIAZ7Q3M5N8P2R4T6V9 Tq9Wn2Xb5Yc8Zd1Ae4Bf7Cg0Dh3Ej6Fk9Gl2Hm5I",
        "Tq9Wn2Xb5Yc8Zd1Ae4Bf7Cg0Dh3Ej6Fk9Gl2Hm5I",
    ),
    ("slack", "SLACK_BOT=xoxb-2048593021-9182736450-QwErTyUiOpAsDfGhJkLz", "9182736450-QwErTyUiOpAsDfGhJkLz"),
    (
        "google api key",
        "maps?key=AIzaSyD8fK2mN5pQ7rS9tU1vW3xY5zA7bC9dE1f",
        "AIzaSyD8fK2mN5pQ7rS9tU1vW3xY5zA7bC9dE1f",
    ),
    (
        "jwt",
        "cookie: session=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    (
        "bearer header",
        "curl -H 'Authorization: Bearer 7fK2mQ9xL4pR8vN3wZ6tY1bH5cJ0dG2e' https://api.example.invalid",
        "7fK2mQ9xL4pR8vN3wZ6tY1bH5cJ0dG2e",
    ),
    (
        "basic auth header",
        "curl -H 'Authorization: Basic YWRtaW46czNjcjN0LXBhc3M=' http://localhost:8080",
        "YWRtaW46czNjcjN0LXBhc3M=",
    ),
    (
        "private key",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7nQ2x9Lk\n-----END RSA PRIVATE KEY-----",
        "MIIEpAIBAAKCAQEA7nQ2x9Lk",
    ),
    ("url password", "DATABASE_URL=postgres://carl:Wx9-hunter2-Q@db.internal:5432/carl", "Wx9-hunter2-Q"),
    ("nats token url", "NATS_URL=nats://s3cr3tT0k3nAbCdEf@127.0.0.1:4222", "s3cr3tT0k3nAbCdEf"),
    ("password assignment", "login with password=Tr0ub4dor&3horse please", "Tr0ub4dor&3horse"),
    ("json api_key", '{"api_key": "c9f8e7d6b5a4c3d2e1f0a9b8", "model": "tiny"}', "c9f8e7d6b5a4c3d2e1f0a9b8"),
    ("token flag", "carl agents up --token Qm7Zp2Xv9Lk4Rt8Wn3Hy", "Qm7Zp2Xv9Lk4Rt8Wn3Hy"),
    ("env secret", "export SECRET_TOKEN=Jd8Kf2Lg5Mh9Nj3Pk7Ql", "Jd8Kf2Lg5Mh9Nj3Pk7Ql"),
    (
        "stripe secret",
        "stripe.api_key = sk_live_51HqLyjWDarjtT1zdp7dcXyZaBcDeFgHiJkLmN",
        "sk_live_51HqLyjWDarjtT1zdp7dcXyZaBcDeFgHiJkLmN",
    ),
    (
        "stripe restricted",
        "use rk_live_51HqLyjWDarjtT1zdXq8Wv3Yt6Ur9Io2Pa",
        "rk_live_51HqLyjWDarjtT1zdXq8Wv3Yt6Ur9Io2Pa",
    ),
    (
        "gitlab",
        "git push https://oauth2:glpat-Xy7Zk9Wq2Rt5Vn8Mp3Ls@gitlab.com/o/r.git",
        "glpat-Xy7Zk9Wq2Rt5Vn8Mp3Ls",
    ),
    ("gitlab, bare", "GITLAB glpat-Ab3Cd5Ef7Gh9Ij1Kl3Mn in CI", "glpat-Ab3Cd5Ef7Gh9Ij1Kl3Mn"),
    ("mysql -p", "mysql -u root -pS3cr3tPa55w0rd -h db carl", "S3cr3tPa55w0rd"),
    (
        "high entropy next to a keyword",
        "the deploy key is 9Xk2Lm7Qp4Rz8Wv3Ny6Bt1Hc",
        "9Xk2Lm7Qp4Rz8Wv3Ny6Bt1Hc",
    ),
    ("high entropy secret, spaced", "secret: Vb8Nq3Wz6Xp1Ry4Tk7Lm2Jh", "Vb8Nq3Wz6Xp1Ry4Tk7Lm2Jh"),
    (
        "npm",
        "//registry.npmjs.org/:_authToken=npm_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2",
        "npm_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2",
    ),
    (
        "pypi",
        "twine upload -p pypi-AgEIcHlwaS5vcmcCJGQ4ZjU2ZTY3LWE4YjktNGM1ZC05ZTBm",
        "pypi-AgEIcHlwaS5vcmcCJGQ4ZjU2ZTY3LWE4YjktNGM1ZC05ZTBm",
    ),
    (
        "sendgrid",
        "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",
        "qR7sT9uV1wX3yZ5aB7cD9eF1gH3iJ5kL7mN9oP1qR3s",
    ),
    (
        "azure storage",
        "DefaultEndpointsProtocol=https;AccountName=carl;"
        "AccountKey=Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy==",
        "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy==",
    ),
    # Issue 30 §7: shapes that reached the Messages API before.
    (
        "wandb key",
        "wandb login 8f3a2c9d1e7b6a5f4c3d2e1f0a9b8c7d6e5f4a3b",
        "8f3a2c9d1e7b6a5f4c3d2e1f0a9b8c7d6e5f4a3b",
    ),
    (
        "wandb key in netrc",
        "machine api.wandb.ai\n  login user\n  password 0a1b2c3d4e5f60718293a4b5c6d7e8f901a2b3c4",
        "0a1b2c3d4e5f60718293a4b5c6d7e8f901a2b3c4",
    ),
    (
        "slack webhook",
        "SLACK_HOOK=https://hooks.slack.com/services/T01ABCDEF/B02GHIJKL/Xy7Zk9Wq2Rt5Vn8Mp3LsAb4C",
        "Xy7Zk9Wq2Rt5Vn8Mp3LsAb4C",
    ),
    (
        "discord webhook",
        "post to https://discord.com/api/webhooks/123456789012345678/aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5zA7bC9d",
        "aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5zA7bC9d",
    ),
    (
        "telegram bot token",
        "curl https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/sendMessage",
        "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
    ),
    (
        "telegram, bare",
        "TG 987654321:AAF9x2Lm5Nz7Wx4Rt9Ky3Pv6Bc1Df0Gj2Hk in .env",
        "AAF9x2Lm5Nz7Wx4Rt9Ky3Pv6Bc1Df0Gj2Hk",
    ),
    (
        "google oauth",
        "access ya29.a0AfH6SMBx7Kq2Lm9Nz5Wv8Rt3Yp6Hc1Df4Gj7Kl0Mn in the log",
        "a0AfH6SMBx7Kq2Lm9Nz5Wv8Rt3Yp6Hc1Df4Gj7Kl0Mn",
    ),
    (
        "digitalocean",
        "doctl auth init -t dop_v1_" + "a1b2c3d4" * 8,
        "dop_v1_" + "a1b2c3d4" * 8,
    ),
    (
        "shopify",
        "X-Shopify-Access-Token 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",
        "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    ),
    ("mailgun", "MG key-3ax6xnjp29jd6fds4gc373sgvjxteol0 for mail", "3ax6xnjp29jd6fds4gc373sgvjxteol0"),
    ("twilio api key", "twilio SK0123456789abcdef0123456789abcdef", "SK0123456789abcdef0123456789abcdef"),
    (
        "groq",
        "GROQ gsk_Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3Ab4Cd5Ef6Gh7Ij8",
        "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv",
    ),
    ("replicate", "r8_Xy7Zk9Wq2Rt5Vn8Mp3LsAb4Cd6Ef8Gh0Ij2Kl", "Xy7Zk9Wq2Rt5Vn8Mp3LsAb4Cd6Ef8Gh0Ij2Kl"),
    ("sshpass", "sshpass -p 'hunter2!' ssh gpu-box", "hunter2!"),
    ("curl user", "curl -u admin:Tr0ub4dor3 https://registry.example.invalid/v2/", "Tr0ub4dor3"),
    (
        "azure sas",
        "https://acct.blob.core.windows.net/ckpt?sv=2022-11-02&ss=b&sig=Zm9vYmFyYmF6cXV4%2Bzm9vYmFy%3D",
        "Zm9vYmFyYmF6cXV4%2Bzm9vYmFy%3D",
    ),
    ("json password, plain value", '{"user": "carl", "password": "hunter2"}', "hunter2"),
]

# Text that must come back exactly as it went in: what the store and the digest are full of.
INTACT: list[str] = [
    "rewards/format/mean",
    "rewards/accuracy_reward/std",
    "train/num_input_tokens_seen",
    "completions/mean_length",
    "actor/entropy",
    "critic/vf_loss",
    "timing_s/gen",
    "response_length/clip_ratio",
    "objective/rlhf_reward",
    "tokens/per_second",
    "token_entropy: 0.5312",
    "num_tokens = 1234567",
    "phi/mean 0.9421 at step 80; reward 0.73 -> 0.74",
    "max_completion_length: 256",
    "learning_rate=2e-05",
    "checkpoint-1200 saved to runs/3-tiny-grpo/checkpoint-1200",
    "commit 3f9a2c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39",  # a git hash: hex, not a key
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "uuid 123e4567-e89b-12d3-a456-426614174000",
    "The secret to a stable run is a small learning rate.",
    "token budget exhausted after 4096 tokens",
    "the key is to lower the KL coefficient",
    "Why did reward plateau at step 80?",
    "password reset is not a training problem",
    "path /home/user/projects/carl-tui/engine/diagnosis/chat.py",
    "Bash command: pytest -q tests/test_store.py -k rollouts",
    "TokenizerFast vocab_size 32000, model_max_length 2048",
    "bearer of bad news: the gate never opened",
    # metric names and paths right after a keyword: the generic checks must not take them for keys
    "key: rewards/accuracy_reward_v2/mean",
    "the key is eval/pass_at_16_temp07",
    "metric key Train/EvalLossTop1/RewardMeanStd/Phi2",
    "token train/num_input_tokens_seen2",
    "token=tests/test_store.py::test_case_12",
    "secret = checkpoints/run12-lora-r16",
    "git_commit: 4e1f2a3b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f",  # a hash named as one
    "HEAD is now at 8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b",
    "curl -u admin https://registry.example.invalid/v2/",  # no password given: curl asks for it
    "time 12:34:56, step 123456789 done",
    "a key-value store",
    "signature=verified; sig=ok",
]
