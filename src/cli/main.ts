#!/usr/bin/env node
/** The `pgasynq` bin: runs the CLI on the process's arguments. */
import { run } from './program.js';

process.exitCode = await run(process.argv.slice(2));
